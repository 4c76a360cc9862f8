// Lets `node --test` import the UI's TypeScript sources: esbuild (Vite's own) strips the types
// on load. Used by the unit tests only; the app itself is built by Vite.
import { register } from "node:module";

register("./typescript-hooks.mjs", import.meta.url);
