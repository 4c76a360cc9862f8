// Module hooks for `register.mjs`: resolve extensionless relative imports to `.ts`/`.tsx` as
// Vite does, and compile those files with esbuild.
import { readFile } from "node:fs/promises";
import { transform } from "esbuild";

export async function resolve(specifier, context, next) {
  if ((specifier.startsWith("./") || specifier.startsWith("../")) && !/\.[cm]?[jt]sx?$/.test(specifier)) {
    for (const extension of [".ts", ".tsx"]) {
      try {
        return await next(`${specifier}${extension}`, context);
      } catch {
        // Try the next extension.
      }
    }
  }
  return next(specifier, context);
}

export async function load(url, context, next) {
  if (!/\.tsx?$/.test(url)) return next(url, context);
  const source = await readFile(new URL(url), "utf8");
  const { code } = await transform(source, {
    loader: url.endsWith(".tsx") ? "tsx" : "ts",
    format: "esm",
    jsx: "automatic",
    jsxImportSource: "preact",
    sourcefile: url,
  });
  return { format: "module", source: code, shortCircuit: true };
}
