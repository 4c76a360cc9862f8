import { defineConfig } from "vite";

// The aggregator embeds dist/ in its binary (aggregator/build.rs) and serves index.html at `/`
// and the hashed files under `/assets/`, a prefix no API route uses. Relative asset URLs let a
// reverse proxy serve it all under a prefix.
export default defineConfig({
  base: "./",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: {
    outDir: "dist",
    assetsDir: "assets",
    emptyOutDir: true,
    target: "es2022",
    sourcemap: false,
  },
  server: {
    // `npm run dev` proxies the API to a local aggregator.
    proxy: Object.fromEntries(
      ["/render", "/render-diff", "/labels", "/label-values", "/api", "/exported-metrics"].map(
        (path) => [path, "http://127.0.0.1:4040"],
      ),
    ),
  },
});
