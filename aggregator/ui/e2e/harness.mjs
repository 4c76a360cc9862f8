// The end-to-end harness: a real aggregator process on a loopback port it chose, with its own data
// directory and a credential configured (so that the page must sign in, as in production),
// seeded through /ingest, and Debian's Chromium driven by playwright-core.

import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { createInterface } from "node:readline";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
export const repo = resolve(here, "../../..");
const target = process.env.CARGO_TARGET_DIR ? resolve(process.env.CARGO_TARGET_DIR) : join(repo, "target");

/** Where screenshots and benchmark output go. */
export const outDir = process.env.SMOLDER_E2E_OUT ? resolve(process.env.SMOLDER_E2E_OUT) : join(target, "ui-e2e");

/** The aggregator binary: $SMOLDER_AGGREGATOR_BIN, or cargo's debug build. */
export const aggregatorBin = process.env.SMOLDER_AGGREGATOR_BIN ?? join(target, "debug", "smolder-aggregator");

/** Chromium's launch flags for a sandboxless, offline CI machine. */
const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/**
 * Resolves with the address in the aggregator's `listening` log line for `listener` (its JSON
 * logs on stderr, forwarded to ours), or rejects when it exits or 30 s pass first.
 * @param {import("node:child_process").ChildProcess} child
 * @param {string} listener
 * @returns {Promise<string>}
 */
function listening(child, listener) {
  return new Promise((ok, fail) => {
    const lines = createInterface({ input: /** @type {import("node:stream").Readable} */ (child.stderr) });
    const timer = setTimeout(() => fail(new Error(`${aggregatorBin}: no ${listener} listener after 30 s`)), 30_000);
    child.once("exit", (code) => fail(new Error(`${aggregatorBin} exited with ${code}`)));
    lines.on("line", (line) => {
      process.stderr.write(`${line}\n`);
      try {
        const { fields } = JSON.parse(line);
        if (fields?.message === "listening" && fields.listener === listener) {
          clearTimeout(timer);
          ok(fields.addr);
        }
      } catch {
        // Not a log line of ours.
      }
    });
  });
}

/**
 * A running aggregator.
 * @typedef {{
 *   url: string,
 *   token: string,
 *   tokens: Record<string, string>,
 *   stop: () => Promise<void>,
 *   fetch: (path: string, init?: RequestInit, as?: string) => Promise<Response>,
 *   ingest: (name: string, at: number, body: string, extra?: Record<string, string>, as?: string) => Promise<void>,
 * }} Aggregator
 */

/**
 * Starts the aggregator binary on a fresh data directory, on port 0, with one admin credential
 * (its token is `token`), and waits for /healthz. With `tenants`, multitenancy is on and each
 * tenant gets an admin credential of its own instead (`tokens[tenant]`; `token` is the first's).
 * @param {{ tenants?: string[] }} [options]
 */
export async function startAggregator({ tenants = [] } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "smolder-ui-e2e-"));
  const config = join(dir, "config.yaml");
  /** @type {Record<string, string>} */
  const tokens = Object.fromEntries(tenants.map((tenant) => [tenant, randomBytes(24).toString("hex")]));
  const token = tenants.length > 0 ? tokens[tenants[0]] : randomBytes(24).toString("hex");
  const credentials =
    tenants.length > 0
      ? tenants.flatMap((tenant) => [
          `    - name: e2e ${tenant}`,
          `      token: ${tokens[tenant]}`,
          "      scopes: [admin]",
          `      tenant: ${tenant}`,
        ])
      : ["    - name: e2e admin", `      token: ${token}`, "      scopes: [admin]"];
  // Both listeners on port 0: a second aggregator in the same run (the empty-state scenario),
  // or a Smolder running on this host, would otherwise collide on the default ports.
  writeFileSync(
    config,
    [
      "http:",
      "  listen: 127.0.0.1:0",
      "ingest:",
      "  quic:",
      "    listen: 127.0.0.1:0",
      ...(tenants.length > 0 ? ["tenant:", "  multitenancy-enabled: true"] : []),
      "auth:",
      "  credentials:",
      ...credentials,
      "",
    ].join("\n"),
  );
  const child = spawn(
    aggregatorBin,
    ["--data-dir", join(dir, "data"), "--config", config, "--log-format", "json", "--log-level", "warn,smolder_daemon=info"],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  const exited = new Promise((ok) => child.once("exit", ok));
  const url = `http://${await listening(child, "http")}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`${aggregatorBin} exited with ${child.exitCode}`);
    try {
      if ((await fetch(`${url}/healthz`)).ok) break;
    } catch {
      // Not listening yet.
    }
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`aggregator on ${url} not ready after 30 s`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  /** @type {Aggregator} */
  const aggregator = {
    url,
    token,
    tokens,
    async stop() {
      child.kill("SIGTERM");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
    fetch(path, init = {}, as = token) {
      const headers = new Headers(init.headers);
      headers.set("authorization", `Bearer ${as}`);
      return fetch(`${url}${path}`, { ...init, headers });
    },
    async ingest(name, at, body, extra = {}, as = token) {
      const params = new URLSearchParams({ name, from: String(at), until: String(at + 10), ...extra });
      const response = await aggregator.fetch(`/ingest?${params}`, { method: "POST", body }, as);
      if (!response.ok) throw new Error(`ingest ${name}: ${response.status} ${await response.text()}`);
    },
  };
  return aggregator;
}

/**
 * Signs a browser context in to `aggregator` the way the page does (`POST login` with its token),
 * so that the context's pages on it are served. The scenarios that test the form itself use it.
 * @param {import("playwright-core").BrowserContext} context
 * @param {Aggregator} aggregator
 */
export async function signIn(context, aggregator, token = aggregator.token) {
  const response = await context.request.post(`${aggregator.url}/login`, { data: { token } });
  if (!response.ok()) throw new Error(`signing in: ${response.status()} ${await response.text()}`);
}

/** A 10 s-aligned unix time `secondsAgo` before now. */
export function ago(secondsAgo) {
  return Math.floor((Date.now() / 1000 - secondsAgo) / 10) * 10;
}

/** Launches Chromium with a fresh profile directory; `close` removes it. */
export async function launchBrowser(viewport = { width: 1280, height: 800 }) {
  const executablePath = process.env.SMOLDER_CHROMIUM ?? "/usr/bin/chromium";
  const profile = mkdtempSync(join(tmpdir(), "smolder-ui-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport,
    acceptDownloads: true,
  });
  return {
    context,
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** Saves a screenshot, of the full page unless `fullPage` is false, as `<outDir>/<name>.png`. */
export async function screenshot(page, name, { fullPage = true } = {}) {
  mkdirSync(outDir, { recursive: true });
  const path = join(outDir, `${name}.png`);
  await page.screenshot({ path, fullPage });
  return path;
}
