// The web UI end to end: a real aggregator seeded with known profiles, driven through headless
// Chromium. Each scenario checks what a person would see (frames, widths, tooltips, tables,
// URLs) and saves a screenshot under target/ui-e2e/.
//
// Widths are checked by hovering: the tooltip names the frame under the pointer, so a frame
// found just inside its expected edges, and its neighbour just outside, pins its width.

import assert from "node:assert/strict";
import { createServer, request as httpRequest } from "node:http";
import { after, before, describe, test } from "node:test";
import { ago, launchBrowser, screenshot, signIn, startAggregator } from "./harness.mjs";

/** Row height of the flame graph (src/flamegraph.ts). */
const ROW = 18;

// Baseline (T1) and comparison (T2) profiles of `shop.cpu`, 100 Hz: json.Marshal triples in prod.
const T1 = ago(2400);
const T2 = ago(600);
const FROM = String(T1 - 60);
const UNTIL = String(T2 + 60);
const BASELINE = [
  "main;http.serve;checkout.handler;json.Marshal 300",
  "main;http.serve;checkout.handler;db.Query 200",
  "main;http.serve;cart.handler;db.Query 100",
  "main;gc 100",
].join("\n");
const STAGING = ["main;http.serve;checkout.handler;json.Marshal 50", "main;gc 50"].join("\n");
const LATER = [
  "main;http.serve;checkout.handler;json.Marshal 900",
  "main;http.serve;checkout.handler;db.Query 200",
  "main;http.serve;cart.handler;db.Query 100",
  "main;gc 100",
].join("\n");

let aggregator;
let browser;

before(async () => {
  aggregator = await startAggregator();
  await aggregator.ingest("shop.cpu{env=prod,region=eu}", T1, BASELINE, { sampleRate: "100", spyName: "gospy" });
  await aggregator.ingest("shop.cpu{env=staging,region=us}", T1, STAGING, { sampleRate: "100", spyName: "gospy" });
  await aggregator.ingest("shop.cpu{env=prod,region=eu}", T2, LATER, { sampleRate: "100", spyName: "gospy" });
  await aggregator.ingest("shop.alloc_space{env=prod}", T1, "main;alloc.buffer 4194304", { units: "bytes" });
  await aggregator.ingest("worker.cpu{env=prod}", T2, "main;worker.run;zstd.compress 500", { sampleRate: "100" });
  browser = await launchBrowser();
  // The aggregator has credentials: the page signs in once, through its form, and every page of
  // the browser after it is served.
  const page = await browser.context.newPage();
  await page.goto(`${aggregator.url}/`);
  await page.getByTestId("sign-in").waitFor();
  await page.getByTestId("sign-in-token").fill(aggregator.token);
  await page.getByTestId("sign-in-submit").click();
  await page.getByTestId("user").waitFor();
  await page.close();
});

after(async () => {
  await browser?.close();
  await aggregator?.stop();
});

/** A new page on `path` of the seeded aggregator, failing the test on any page error. */
async function open(path, viewport) {
  const page = await browser.context.newPage();
  if (viewport) await page.setViewportSize(viewport);
  const errors = [];
  page.on("pageerror", (err) => errors.push(err));
  page.errors = errors;
  await page.goto(`${aggregator.url}${path}`);
  return page;
}

/** Closes a page, failing the test if a script on it threw. */
async function done(page) {
  assert.deepEqual(page.errors ?? [], [], "uncaught errors in the page");
  await page.close();
}

function single(extra = "") {
  return `/?query=${encodeURIComponent("shop.cpu{}")}&from=${FROM}&until=${UNTIL}${extra}`;
}

/**
 * The frame under (fraction of the width, level) of the flame graph `testId`, via its tooltip.
 * @param {{ inverted?: boolean, timeout?: number }} [options] `timeout`: ms to wait for the tooltip.
 */
async function frameAt(page, testId, fraction, level, options = {}) {
  const { inverted = false, timeout } = options;
  const canvas = page.getByTestId(testId).locator("canvas");
  const box = await canvas.boundingBox();
  const rows = Math.round(box.height / ROW);
  const row = inverted ? rows - 1 - level : level;
  await page.mouse.move(box.x + fraction * box.width, box.y + row * ROW + ROW / 2);
  const tooltip = page.getByTestId(testId).getByTestId("tooltip");
  await tooltip.waitFor({ timeout });
  return {
    name: await tooltip.locator(".tooltip-name").innerText(),
    text: await tooltip.innerText(),
  };
}

/**
 * The frame under (fraction, level) once it is `name`: after a new query, the graph (and the
 * summary beside the toolbar, which moves it) can change after the pointer moved, so the pointer
 * leaves and comes back, reading the canvas's position anew, until it is or 5 s passed.
 */
async function frameNamed(page, testId, fraction, level, name) {
  for (let tries = 0; ; tries++) {
    const last = tries === 50;
    const frame = await frameAt(page, testId, fraction, level, { timeout: last ? undefined : 100 }).catch((err) => {
      if (last) throw err;
      return null;
    });
    if (last || frame?.name === name) return frame;
    await page.mouse.move(0, 0);
    await page.waitForTimeout(100);
  }
}

async function clickFrame(page, testId, fraction, level) {
  const canvas = page.getByTestId(testId).locator("canvas");
  const box = await canvas.boundingBox();
  await page.mouse.click(box.x + fraction * box.width, box.y + level * ROW + ROW / 2);
}

/** The RGB of the flame graph's pixel at (fraction, level). */
async function pixel(page, testId, fraction, level) {
  return page.getByTestId(testId).locator("canvas").evaluate(
    (canvas, [f, l, row]) => {
      const ctx = canvas.getContext("2d");
      const ratio = canvas.width / canvas.clientWidth;
      const [r, g, b] = ctx.getImageData(Math.floor(f * canvas.width), Math.floor((l * row + 3) * ratio), 1, 1).data;
      return [r, g, b];
    },
    [fraction, level, ROW],
  );
}

async function tableNames(page) {
  return page.getByTestId("top-table").locator("tbody td.fn button").allInnerTexts();
}

function param(page, name) {
  return new URL(page.url()).searchParams.get(name);
}

describe("web UI", () => {
  test("an empty aggregator says how to send it profiles", async () => {
    const empty = await startAggregator();
    try {
      await signIn(browser.context, empty);
      const page = await browser.context.newPage();
      await page.goto(`${empty.url}/`);
      await page.getByTestId("no-data").waitFor();
      const text = await page.getByTestId("no-data").innerText();
      assert.match(text, /No profiles yet/);
      assert.match(text, /\/ingest\?name=checkout\.cpu/);
      assert.match(text, new RegExp(`http://127\\.0\\.0\\.1:\\d+`));
      await screenshot(page, "01-empty-state");
      await done(page);
    } finally {
      await empty.stop();
    }
  });

  test("the single view shows the expected frames with the expected widths", async () => {
    const page = await open(single());
    await page.getByTestId("flamegraph").locator("canvas").waitFor();
    assert.equal(await page.getByTestId("app-service").inputValue(), "shop");
    assert.equal(await page.getByTestId("app-type").inputValue(), "cpu");
    // 2100 samples: gc 250 | http.serve 1850 → cart.handler 200 | checkout.handler 1650 →
    // db.Query 400 [450, 850) | json.Marshal 1250 [850, 2100).
    assert.equal((await frameAt(page, "flamegraph", 0.5, 1)).name, "main");
    assert.equal((await frameAt(page, "flamegraph", 0.11, 2)).name, "gc");
    assert.equal((await frameAt(page, "flamegraph", 0.13, 2)).name, "http.serve");
    assert.equal((await frameAt(page, "flamegraph", 0.2, 3)).name, "cart.handler");
    assert.equal((await frameAt(page, "flamegraph", 0.23, 3)).name, "checkout.handler");
    assert.equal((await frameAt(page, "flamegraph", 0.23, 4)).name, "db.Query");
    assert.equal((await frameAt(page, "flamegraph", 0.39, 4)).name, "db.Query");
    const marshal = await frameAt(page, "flamegraph", 0.42, 4);
    assert.equal(marshal.name, "json.Marshal");
    // Tooltips give CPU as seconds (100 Hz), with the share and the raw samples.
    assert.match(marshal.text, /12\.50 s/);
    assert.match(marshal.text, /59\.52%/);
    assert.match(marshal.text, /1,250 total/);
    assert.equal((await frameAt(page, "flamegraph", 0.99, 4)).name, "json.Marshal");
    // The timeline has the two pushes.
    await page.getByTestId("timeline").locator("path").first().waitFor();
    await screenshot(page, "02-single-view");
    await done(page);
  });

  test("clicking a frame zooms into it, the URL keeps the zoom, reset returns", async () => {
    const page = await open(single());
    await page.getByTestId("flamegraph").locator("canvas").waitFor();
    await clickFrame(page, "flamegraph", 0.5, 3);
    await page.waitForURL(/focus=/);
    assert.equal(param(page, "focus"), "main;http.serve;checkout.handler");
    // checkout.handler now spans the width: db.Query 400 of 1750, then json.Marshal.
    assert.equal((await frameAt(page, "flamegraph", 0.2, 4)).name, "db.Query");
    assert.equal((await frameAt(page, "flamegraph", 0.26, 4)).name, "json.Marshal");
    assert.match(await page.getByTestId("selection").innerText(), /checkout\.handler/);
    await screenshot(page, "03-zoomed");
    // A reload of the same URL shows the same zoom.
    await page.reload();
    assert.equal((await frameAt(page, "flamegraph", 0.2, 4)).name, "db.Query");
    await page.getByTestId("reset-zoom").click();
    await page.waitForURL((url) => !url.searchParams.has("focus"));
    assert.equal((await frameAt(page, "flamegraph", 0.2, 4)).name, "db.Query");
    assert.equal((await frameAt(page, "flamegraph", 0.5, 4)).name, "json.Marshal");
    await done(page);
  });

  test("search highlights matching frames and filters the table", async () => {
    const page = await open(single());
    await page.getByTestId("flamegraph").locator("canvas").waitFor();
    const before = await pixel(page, "flamegraph", 0.1, 2);
    await page.keyboard.press("/");
    await page.keyboard.type("json");
    await page.waitForURL(/search=json/);
    assert.deepEqual(await tableNames(page), ["json.Marshal"]);
    // Frames that do not match are dimmed to grey.
    const gc = await pixel(page, "flamegraph", 0.1, 2);
    assert.notDeepEqual(gc, before);
    assert.deepEqual(gc, [228, 228, 231]);
    await screenshot(page, "04-search");
    await page.getByTestId("search").fill("nothing-like-this");
    await page.getByText(/No function matches/).waitFor();
    // Hovering a table row highlights that function's frames alone.
    await page.getByTestId("search").fill("");
    await page.getByTestId("top-table").locator("tr", { hasText: "gc" }).hover();
    assert.deepEqual(await pixel(page, "flamegraph", 0.7, 4), [228, 228, 231], "json.Marshal dimmed");
    assert.notDeepEqual(await pixel(page, "flamegraph", 0.05, 2), [228, 228, 231], "gc stays coloured");
    await page.mouse.move(0, 0);
    assert.notDeepEqual(await pixel(page, "flamegraph", 0.7, 4), [228, 228, 231], "back to normal");
    await done(page);
  });

  test("the top table sorts by self and by total", async () => {
    const page = await open(single("&tab=table"));
    await page.getByTestId("top-table").waitFor();
    await page.getByTestId("sort-self").click();
    assert.deepEqual((await tableNames(page)).slice(0, 3), ["json.Marshal", "db.Query", "gc"]);
    const first = await page.getByTestId("top-table").locator("tbody tr").first().innerText();
    assert.match(first, /12\.50 s/);
    await page.getByTestId("sort-total").click();
    await page.waitForURL(/sort=total/);
    assert.deepEqual((await tableNames(page)).slice(0, 4), ["main", "http.serve", "checkout.handler", "json.Marshal"]);
    await screenshot(page, "05-table-sorted-by-total");
    // The frame budget: with 4 frames kept, the smallest fold into "other".
    await page.goto(`${aggregator.url}${single("&tab=table&maxNodes=4&sort=total")}`);
    await page.getByTestId("top-table").waitFor();
    assert.equal(await page.getByTestId("max-nodes").inputValue(), "4");
    assert.ok((await tableNames(page)).includes("other"), "truncated frames fold into other");
    await page.getByTestId("max-nodes").selectOption("65536");
    await page.waitForURL(/maxNodes=65536/);
    await page.getByTestId("top-table").locator("tbody tr", { hasText: "json.Marshal" }).waitFor();
    assert.ok(!(await tableNames(page)).includes("other"));
    await done(page);
  });

  test("a label filter narrows the flame graph and lives in the URL", async () => {
    const page = await open(single());
    await page.getByTestId("flamegraph").locator("canvas").waitFor();
    assert.match((await frameAt(page, "flamegraph", 0.5, 0)).text, /21\.00 s/);
    await page.getByTestId("filter-name").selectOption("env");
    await page.getByTestId("filter-value").selectOption("prod");
    await page.getByTestId("filter-add").click();
    await page.waitForURL(/env/);
    assert.equal(param(page, "query"), 'shop.cpu{env="prod"}');
    await page.getByText('env="prod"').waitFor();
    await expectRootTotal(page, /20\.00 s/);
    await screenshot(page, "06-label-filter");
    await done(page);
  });

  test("the diff colours frames by change of share, or by absolute change", async () => {
    const prod = encodeURIComponent('shop.cpu{env="prod"}');
    const path =
      `/?view=diff&query=${prod}&from=${FROM}&until=${UNTIL}` +
      `&leftFrom=${T1 - 60}&leftUntil=${T1 + 60}&rightFrom=${T2 - 60}&rightUntil=${T2 + 60}`;
    const page = await open(path);
    await page.getByTestId("diff-flamegraph").locator("canvas").waitFor();
    await page.getByTestId("diff-legend").waitFor();
    assert.match(await page.getByTestId("diff-legend").innerText(), /share/);
    assert.equal(await page.title(), 'shop.cpu{env="prod"} · Diff · Smolder');
    // Widths are baseline + comparison: db.Query 200+200 at [0.2, 0.4), json.Marshal 300+900.
    const marshal = await frameAt(page, "diff-flamegraph", 0.7, 4);
    assert.equal(marshal.name, "json.Marshal");
    assert.match(marshal.text, /42\.86%/);
    assert.match(marshal.text, /69\.23%/);
    const [r, g] = await pixel(page, "diff-flamegraph", 0.7, 4);
    assert.ok(r > g + 60, `json.Marshal's share grew: red, got ${r},${g}`);
    const query = await pixel(page, "diff-flamegraph", 0.3, 4);
    assert.ok(query[1] > query[0] + 30, `db.Query's share shrank: green, got ${query}`);
    await clickFrame(page, "diff-flamegraph", 0.7, 4);
    assert.match(await page.getByTestId("selection").innerText(), /baseline 3\.00 s \(42\.86%\), comparison 9\.00 s \(69\.23%\)/);
    await clickFrame(page, "diff-flamegraph", 0.5, 0);
    await screenshot(page, "07-diff-share");
    await page.getByTestId("color-absolute").click();
    await page.waitForURL(/color=absolute/);
    assert.deepEqual(await pixel(page, "diff-flamegraph", 0.3, 4), [148, 142, 142], "db.Query unchanged in value: grey");
    assert.match(await page.getByTestId("diff-legend").innerText(), /absolute/);
    await screenshot(page, "08-diff-absolute");
    await done(page);
  });

  test("default comparison halves a relative range and loads it once", async () => {
    const page = await browser.context.newPage();
    const diffs = [];
    page.on("request", (request) => {
      if (request.url().includes("/render-diff")) diffs.push(new URL(request.url()).searchParams);
    });
    await page.goto(`${aggregator.url}/?view=diff&query=${encodeURIComponent('shop.cpu{env="prod"}')}`);
    await page.getByTestId("diff-flamegraph").locator("canvas").waitFor();
    await page.mouse.move(10, 10);
    await page.waitForTimeout(1500);
    assert.equal(diffs.length, 1, "one diff request, not one per render");
    const [request] = diffs;
    assert.deepEqual(
      ["leftFrom", "leftUntil", "rightFrom", "rightUntil"].map((k) => request.get(k)),
      ["now-1h", "now-1800s", "now-1800s", "now"],
    );
    // T1 (40 min ago) is the baseline, T2 (10 min ago) the comparison.
    assert.match((await frameAt(page, "diff-flamegraph", 0.5, 0)).text, /7\.00 s\s+13\.00 s/);
    await done(page);
  });

  test("a single view opens as a diff against the period before it", async () => {
    const page = await open(single());
    await page.getByTestId("flamegraph").locator("canvas").waitFor();
    await page.getByTestId("diff-previous").click();
    await page.waitForURL(/view=diff/);
    const span = Number(UNTIL) - Number(FROM);
    assert.deepEqual(
      ["leftFrom", "leftUntil", "rightFrom", "rightUntil"].map((k) => param(page, k)),
      [String(Number(FROM) - span), FROM, FROM, UNTIL],
    );
    await page.getByTestId("diff-flamegraph").locator("canvas").waitFor();
    // Nothing before: every frame is new, so red.
    const tooltip = (await frameAt(page, "diff-flamegraph", 0.5, 1)).text;
    assert.match(tooltip, /main/);
    assert.match(tooltip, /\+100\.0%/);
    await done(page);
  });

  test("comparison shows both selections side by side with their timelines", async () => {
    const prod = encodeURIComponent('shop.cpu{env="prod"}');
    const page = await open(
      `/?view=compare&query=${prod}&from=${FROM}&until=${UNTIL}` +
        `&leftFrom=${T1 - 60}&leftUntil=${T1 + 60}&rightFrom=${T2 - 60}&rightUntil=${T2 + 60}`,
    );
    await page.getByTestId("left-flamegraph").locator("canvas").waitFor();
    await page.getByTestId("right-flamegraph").locator("canvas").waitFor();
    assert.match((await frameAt(page, "left-flamegraph", 0.5, 0)).text, /7\.00 s/);
    assert.match((await frameAt(page, "right-flamegraph", 0.5, 0)).text, /13\.00 s/);
    // Dragging on the comparison's timeline picks its range.
    const timeline = page.getByTestId("right-timeline").locator("svg");
    const box = await timeline.boundingBox();
    // T2's push sits at 97% of the overall range: drag from 90% to the end.
    await page.mouse.move(box.x + box.width * 0.9, box.y + 40);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.999, box.y + 40, { steps: 5 });
    await page.mouse.up();
    await page.waitForURL((url) => url.searchParams.get("rightFrom") !== String(T2 - 60));
    const from = Number(param(page, "rightFrom"));
    const until = Number(param(page, "rightUntil"));
    assert.ok(from > T1 && from < T2 && until > T2 && until <= T2 + 60, `${from}..${until}`);
    await page.mouse.move(0, 0);
    assert.match((await frameAt(page, "right-flamegraph", 0.5, 0)).text, /13\.00 s/);
    await screenshot(page, "09-comparison");
    await done(page);
  });

  test("the label explorer breaks a profile type down by a label, and a value opens the single view", async () => {
    const page = await open(`/?view=explore&query=${encodeURIComponent("shop.cpu{}")}&from=${FROM}&until=${UNTIL}&groupBy=env`);
    const table = page.getByTestId("explore-table");
    await table.locator("tbody tr").first().waitFor();
    const rows = await table.locator("tbody tr").allInnerTexts();
    assert.equal(rows.length, 2, rows.join("\n"));
    assert.match(rows[0], /prod\s+20\.00 s\s+95\.24%/);
    assert.match(rows[1], /staging\s+1\.00 s\s+4\.76%/);
    assert.equal(await page.getByTestId("timeline").locator("path").count(), 2);
    await screenshot(page, "10-label-explorer");
    await table.getByRole("link", { name: "staging" }).click();
    await page.waitForURL((url) => !url.searchParams.has("view"));
    assert.equal(param(page, "query"), 'shop.cpu{env="staging"}');
    await expectRootTotal(page, /1\.00 s/);
    await done(page);
  });

  test("the sandwich view shows a function's callers and callees", async () => {
    const page = await open(single());
    await page.getByTestId("flamegraph").locator("canvas").waitFor();
    await clickFrame(page, "flamegraph", 0.25, 4);
    await page.getByTestId("action-sandwich").click();
    await page.waitForURL(/tab=sandwich/);
    assert.equal(param(page, "fn"), "db.Query");
    await page.getByTestId("sandwich-callers").locator("canvas").waitFor();
    // Callers grow upwards from db.Query (600): cart.handler 200, checkout.handler 400.
    assert.equal((await frameAt(page, "sandwich-callers", 0.5, 1, { inverted: true })).name, "db.Query");
    assert.equal((await frameAt(page, "sandwich-callers", 0.1, 2, { inverted: true })).name, "cart.handler");
    assert.equal((await frameAt(page, "sandwich-callers", 0.6, 2, { inverted: true })).name, "checkout.handler");
    assert.equal((await frameAt(page, "sandwich-callers", 0.6, 4, { inverted: true })).name, "main");
    assert.match((await frameAt(page, "sandwich-callees", 0.5, 1)).text, /6\.00 s/);
    await screenshot(page, "11-sandwich");
    await done(page);
  });

  test("keyboard: arrows move the selection, Enter zooms, Escape resets", async () => {
    const page = await open(single());
    const canvas = page.getByTestId("flamegraph").locator("canvas");
    await canvas.waitFor();
    await canvas.focus();
    for (let i = 0; i < 3; i++) await page.keyboard.press("ArrowDown");
    assert.match(await page.getByTestId("selection").innerText(), /^checkout\.handler/);
    await page.keyboard.press("ArrowDown");
    assert.match(await page.getByTestId("selection").innerText(), /^json\.Marshal/);
    await page.keyboard.press("ArrowLeft");
    assert.match(await page.getByTestId("selection").innerText(), /^db\.Query/);
    await page.keyboard.press("ArrowUp");
    await page.keyboard.press("Enter");
    await page.waitForURL(/focus=/);
    assert.equal(param(page, "focus"), "main;http.serve;checkout.handler");
    await screenshot(page, "12-keyboard");
    await page.keyboard.press("Escape");
    await page.waitForURL((url) => !url.searchParams.has("focus"));
    await done(page);
  });

  test("exports download pprof, collapsed and JSON of the selection", async () => {
    const page = await open(single());
    await page.getByTestId("flamegraph").locator("canvas").waitFor();
    const link = async (id) => new URL(await page.getByTestId(id).getAttribute("href"), aggregator.url).toString();
    const collapsed = await page.request.get(await link("export-collapsed"));
    assert.equal(collapsed.status(), 200);
    assert.match(collapsed.headers()["content-disposition"], /attachment; filename="shop\.cpu .*\.collapsed\.txt"/);
    assert.match(await collapsed.text(), /^main;http\.serve;checkout\.handler;json\.Marshal 1250$/m);
    const pprof = await page.request.get(await link("export-pprof"));
    assert.equal(pprof.status(), 200);
    const bytes = await pprof.body();
    assert.deepEqual([...bytes.subarray(0, 2)], [0x1f, 0x8b], "gzipped pprof");
    const [download] = await Promise.all([page.waitForEvent("download"), page.getByTestId("export-json").click()]);
    assert.equal(download.suggestedFilename(), "shop.cpu.json");
    const json = JSON.parse(await streamText(await download.createReadStream()));
    assert.equal(json.flamebearer.numTicks, 2100);
    await screenshot(page, "13-exports");
    await done(page);
  });

  test("time range: presets, custom ranges and drag-to-zoom on the timeline", async () => {
    const page = await open(single());
    await page.getByTestId("flamegraph").locator("canvas").waitFor();
    const box = await page.getByTestId("timeline").locator("svg").boundingBox();
    await page.mouse.move(box.x + box.width * 0.7, box.y + 50);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.99, box.y + 50, { steps: 5 });
    await page.mouse.up();
    await page.waitForURL((url) => url.searchParams.get("from") !== FROM);
    const from = Number(param(page, "from"));
    assert.ok(from > T1 && from < T2, `zoomed to the later push: from ${from}`);
    // Only the later push (1300 samples) is in the range now.
    await expectRootTotal(page, /13\.00 s/);
    await screenshot(page, "14-drag-zoom");
    await page.getByTestId("range-preset").selectOption("now-6h");
    await page.waitForURL(/from=now-6h/);
    assert.equal(param(page, "until"), "now");
    await page.getByTestId("range-preset").selectOption("custom");
    await page.getByTestId("range-from").fill("2020-01-01T10:00");
    await page.getByTestId("range-until").fill("2020-01-01T11:00");
    await page.getByTestId("range-apply").click();
    await page.waitForURL((url) => /^\d+$/.test(url.searchParams.get("from") ?? ""));
    assert.equal(Number(param(page, "until")) - Number(param(page, "from")), 3600);
    await page.getByTestId("no-samples").waitFor();
    await done(page);
  });

  test("API errors are shown in words", async () => {
    const page = await open(`/?query=${encodeURIComponent('shop.cpu{env=~"("}')}&from=${FROM}&until=${UNTIL}`);
    const error = page.getByTestId("error").first();
    await error.waitFor();
    const text = await error.innerText();
    assert.match(text, /could not answer/);
    assert.match(text, /400 from \/render: invalid `query`/);
    await screenshot(page, "15-api-error");
    await done(page);
  });

  test("behind a reverse proxy that serves the aggregator under a prefix", async () => {
    // A minimal proxy: /smolder/<path> goes to the aggregator's /<path>, the way nginx's
    // `location /smolder/ { proxy_pass http://aggregator/; }` forwards it.
    const upstream = new URL(aggregator.url);
    const proxy = createServer((req, res) => {
      if (!req.url.startsWith("/smolder/")) {
        res.writeHead(404).end("outside the prefix\n");
        return;
      }
      const forward = httpRequest(
        { host: upstream.hostname, port: upstream.port, path: req.url.slice("/smolder".length), method: req.method, headers: req.headers },
        (answer) => {
          res.writeHead(answer.statusCode, answer.headers);
          answer.pipe(res);
        },
      );
      req.pipe(forward);
    });
    await new Promise((ok) => proxy.listen(0, "127.0.0.1", () => ok(undefined)));
    // A browser of its own, not signed in: it signs in through the proxy, and its session cookie
    // must then work under the prefix.
    const fresh = await launchBrowser();
    try {
      const page = await fresh.context.newPage();
      const errors = [];
      page.on("pageerror", (err) => errors.push(err));
      const { port } = /** @type {import("node:net").AddressInfo} */ (proxy.address());
      await page.goto(`http://127.0.0.1:${port}/smolder/?query=${encodeURIComponent("shop.cpu{}")}&from=${FROM}&until=${UNTIL}`);
      await page.getByTestId("sign-in-token").fill(aggregator.token);
      await page.getByTestId("sign-in-submit").click();
      await page.getByTestId("flamegraph").locator("canvas").waitFor();
      const cookies = await fresh.context.cookies();
      assert.deepEqual(
        cookies.map((c) => [c.path, c.httpOnly, c.sameSite]),
        [["/smolder", true, "Strict"]],
        "the session cookie is scoped to the prefix",
      );
      assert.equal((await frameAt(page, "flamegraph", 0.42, 4)).name, "json.Marshal");
      await clickFrame(page, "flamegraph", 0.5, 3);
      await page.waitForURL((url) => url.pathname === "/smolder/" && url.searchParams.has("focus"));
      assert.deepEqual(errors, [], "uncaught errors in the page");
    } finally {
      await fresh.close();
      proxy.close();
    }
  });

  test("signing in: a wrong token is refused in words, the right one opens the page, signing out ends it", async () => {
    const fresh = await launchBrowser();
    try {
      const page = await fresh.context.newPage();
      const errors = [];
      page.on("pageerror", (err) => errors.push(err));
      await page.goto(`${aggregator.url}${single()}`);
      await page.getByTestId("sign-in").waitFor();
      await screenshot(page, "00-sign-in");
      await page.getByTestId("sign-in-token").fill("not-the-token");
      await page.getByTestId("sign-in-submit").click();
      const error = page.getByTestId("sign-in-error");
      await error.waitFor();
      assert.match(await error.innerText(), /401 from \/login: unknown credentials/);
      await page.getByTestId("sign-in-token").fill(aggregator.token);
      await page.getByTestId("sign-in-submit").click();
      await page.getByTestId("flamegraph").locator("canvas").waitFor();
      assert.match(await page.getByTestId("user").innerText(), /Signed in as\s+e2e admin/);
      // A change made without the page's CSRF token is refused, even with the session cookie.
      const forged = await page.request.post(`${aggregator.url}/api/recording-rules`, {
        data: { name: "forged_total", expr: "shop.cpu{}" },
      });
      assert.equal(forged.status(), 403);
      assert.match(await forged.text(), /CSRF token/);
      await page.getByTestId("sign-out").click();
      await page.getByTestId("sign-in").waitFor();
      const after = await page.request.get(`${aggregator.url}/api/apps`);
      assert.equal(after.status(), 401, "the session is gone");
      assert.deepEqual(errors, [], "uncaught errors in the page");
    } finally {
      await fresh.close();
    }
  });

  test("usable at 1280×800 and 1920×1080: nothing overflows sideways", async () => {
    for (const viewport of [
      { width: 1280, height: 800 },
      { width: 1920, height: 1080 },
    ]) {
      for (const path of [single(), single("&view=diff"), `/?view=explore&query=shop.cpu%7B%7D&from=${FROM}&until=${UNTIL}`]) {
        const page = await open(path, viewport);
        await page.locator("canvas, [data-testid=explore-table]").first().waitFor();
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        assert.ok(overflow <= 0, `${path} at ${viewport.width}×${viewport.height} overflows by ${overflow}px`);
        if (path === single()) await screenshot(page, `16-single-${viewport.width}x${viewport.height}`);
        await done(page);
      }
    }
  });

  test("a recording rule created from a flame-graph frame is listed and exported", async () => {
    const probe = await aggregator.fetch("/api/recording-rules");
    assert.equal(probe.status, 200, `GET /api/recording-rules: ${probe.status} ${await probe.text()}`);
    const page = await open(single());
    page.on("dialog", (dialog) => dialog.accept());
    await page.getByTestId("flamegraph").locator("canvas").waitFor();
    await clickFrame(page, "flamegraph", 0.7, 4);
    assert.match(await page.getByTestId("selection").innerText(), /^json\.Marshal/);
    await page.getByTestId("action-rule").click();
    await page.waitForURL(/view=rules/);
    assert.equal(await page.getByTestId("rule-function").inputValue(), "json.Marshal");
    assert.equal(await page.getByTestId("rule-expr").inputValue(), "shop.cpu{}");
    assert.equal(await page.getByTestId("rule-name").inputValue(), "shop_json_marshal_cpu");
    await page.getByTestId("rule-group-by").fill("env");
    await page.getByTestId("rule-create").click();
    const row = page.getByTestId("rules-table").locator("tbody tr", { hasText: "shop_json_marshal_cpu" });
    await row.waitFor();
    assert.match(await row.innerText(), /json\.Marshal/);
    await screenshot(page, "17-rule-created");
    // The rule counts what is ingested from now on.
    await aggregator.ingest("shop.cpu{env=prod,region=eu}", ago(30), "main;http.serve;checkout.handler;json.Marshal 250", {
      sampleRate: "100",
    });
    const exported = await (await aggregator.fetch("/exported-metrics")).text();
    assert.match(exported, /^shop_json_marshal_cpu\{env="prod"\} 2\.5$/m);
    // A duplicate name is refused in words.
    await page.getByTestId("rule-name").fill("shop_json_marshal_cpu");
    await page.getByTestId("rule-function").fill("json.Marshal");
    await page.getByTestId("rule-create").click();
    await page.getByTestId("error").waitFor();
    assert.match(await page.getByTestId("error").innerText(), /409/);
    await row.getByRole("button", { name: /Delete/ }).click();
    await row.waitFor({ state: "detached" });
    await done(page);
  });

  test("off-CPU and memory-growth series are in the type picker, in seconds and in bytes", async () => {
    // Their own aggregator: a service with the agent's three eBPF types, in the agent's units.
    const agg = await startAggregator();
    try {
      await signIn(browser.context, agg);
      const at = ago(300);
      await agg.ingest("db.cpu{env=prod}", at, "main;db.query 100", { sampleRate: "100" });
      await agg.ingest("db.off_cpu{env=prod}", at, "main;db.lock;futex_wait 1500000000\nmain;db.poll 500000000", {
        units: "nanoseconds",
      });
      await agg.ingest("db.memory_growth{env=prod}", at, "main;db.load 6291456", { units: "bytes" });
      const page = await browser.context.newPage();
      const errors = [];
      page.on("pageerror", (err) => errors.push(err));
      await page.goto(`${agg.url}/?query=${encodeURIComponent("db.off_cpu{}")}&from=${at - 60}&until=${at + 70}`);
      await page.getByTestId("flamegraph").locator("canvas").waitFor();
      assert.deepEqual(await page.getByTestId("app-type").locator("option").allInnerTexts(), [
        "cpu",
        "memory_growth",
        "off_cpu",
      ]);
      assert.equal(await page.getByTestId("app-type").inputValue(), "off_cpu");
      // Nanoseconds read as time: db.lock is 1.5 s of 2 s.
      const lock = await frameAt(page, "flamegraph", 0.3, 2);
      assert.equal(lock.name, "db.lock");
      assert.match(lock.text, /total\s+1\.50 s\s+75\.00%/);
      await screenshot(page, "20-off-cpu");
      // The picker switches to memory growth, which reads as bytes.
      await page.getByTestId("app-type").selectOption("memory_growth");
      await page.waitForURL((url) => (url.searchParams.get("query") ?? "").startsWith("db.memory_growth"));
      const load = await frameNamed(page, "flamegraph", 0.5, 2, "db.load");
      assert.equal(load.name, "db.load");
      assert.match(load.text, /total\s+6\.00 MiB/);
      await screenshot(page, "21-memory-growth");
      assert.deepEqual(errors, [], "uncaught errors in the page");
      await page.close();
    } finally {
      await agg.stop();
    }
  });

  test("the header shows the tenant the aggregator serves the page as", async () => {
    const page = await open(single());
    const tenant = page.getByTestId("tenant");
    await tenant.waitFor();
    assert.equal(await tenant.innerText(), "Tenant anonymous");
    await done(page);
  });

  test("two tenants signed in to one aggregator each see their own tenant and flame graph", async () => {
    const tenants = await startAggregator({ tenants: ["team-a", "team-b"] });
    try {
      const at = ago(300);
      for (const [tenant, frame] of [["team-a", "a.only"], ["team-b", "b.only"]]) {
        await tenants.ingest("shop.cpu", at, `main;${frame} 100`, { sampleRate: "100" }, tenants.tokens[tenant]);
      }
      const query = `/?query=${encodeURIComponent("shop.cpu{}")}&from=${at - 60}&until=${at + 70}`;
      for (const [tenant, own, other] of [["team-a", "a.only", "b.only"], ["team-b", "b.only", "a.only"]]) {
        const ownBrowser = await launchBrowser();
        try {
          await signIn(ownBrowser.context, tenants, tenants.tokens[tenant]);
          const page = await ownBrowser.context.newPage();
          const errors = [];
          page.on("pageerror", (err) => errors.push(err));
          await page.goto(`${tenants.url}${query}`);
          const header = page.getByTestId("tenant");
          await header.waitFor();
          assert.equal(await header.innerText(), `Tenant ${tenant}`);
          await page.getByTestId("flamegraph").locator("canvas").waitFor();
          // The tenant's one stack, total → main → its own frame across the whole width: the
          // other tenant's frame, pushed under the same app name, would take half of it.
          for (const fraction of [0.02, 0.5, 0.98]) {
            const frame = (await frameAt(page, "flamegraph", fraction, 2)).name;
            assert.equal(frame, own, `${tenant} at ${fraction} sees ${frame}, not ${other}`);
          }
          // The table beside the graph lists the tenant's own functions only.
          const pageText = await page.locator("body").innerText();
          assert.ok(pageText.includes(own) && !pageText.includes(other), `${tenant}'s table`);
          await screenshot(page, `22-tenant-${tenant}`);
          assert.deepEqual(errors, [], "uncaught errors in the page");
        } finally {
          await ownBrowser.close();
        }
      }
    } finally {
      await tenants.stop();
    }
  });

  test("a deep graph draws only the rows on screen and follows the scroll", async () => {
    const deep = await startAggregator();
    try {
      await signIn(browser.context, deep);
      // 300 frames deep: 5.4k px of graph in an 800 px window.
      const frames = ["main"];
      for (let d = 0; d < 300; d++) frames.push(`deep.f${d}`);
      const at = ago(300);
      await deep.ingest("deep.cpu", at, `${frames.join(";")} 100\nmain;other.g 100`, { sampleRate: "100" });
      const page = await browser.context.newPage();
      const errors = [];
      page.on("pageerror", (err) => errors.push(err));
      await page.goto(`${deep.url}/?query=deep.cpu%7B%7D&from=${at - 60}&until=${at + 60}&tab=flame`);
      const canvas = page.getByTestId("flamegraph").locator("canvas");
      await canvas.waitFor();
      const graph = page.getByTestId("flamegraph").locator(".flamegraph-canvas");
      assert.equal((await graph.boundingBox()).height, 302 * ROW, "the box is as tall as the graph");
      assert.ok((await canvas.boundingBox()).height <= 800 + ROW, "the canvas is at most a window and a row tall");
      const rows = Number(await canvas.getAttribute("data-rows"));
      assert.ok(rows > 10 && rows <= Math.ceil(800 / ROW), `${rows} rows drawn`);
      // Scroll 200 rows down: the rows now on screen are drawn, and hit-testing follows.
      const top = (await graph.boundingBox()).y;
      await page.mouse.wheel(0, top + 200 * ROW);
      await page.waitForFunction(
        () => parseFloat(document.querySelector("[data-testid=flamegraph] canvas")?.getAttribute("style")?.match(/top: ([\d.]+)px/)?.[1] ?? "0") > 0,
      );
      const box = await graph.boundingBox();
      const level = Math.ceil(-box.y / ROW) + 5;
      await page.mouse.move(box.x + box.width * 0.25, box.y + level * ROW + ROW / 2);
      const tooltip = page.getByTestId("flamegraph").getByTestId("tooltip");
      await tooltip.waitFor();
      assert.equal(await tooltip.locator(".tooltip-name").innerText(), `deep.f${level - 2}`);
      const drawn = await canvas.evaluate((c, [l, row]) => {
        const ctx = c.getContext("2d");
        const ratio = c.width / c.clientWidth;
        const y = (l * row + 3 - parseFloat(/** @type {HTMLCanvasElement} */ (c).style.top)) * ratio;
        return [...ctx.getImageData(Math.floor(c.width * 0.25), Math.floor(y), 1, 1).data];
      }, [level, ROW]);
      assert.notDeepEqual(drawn.slice(0, 3), [0, 0, 0], "the row under the pointer is drawn");
      assert.notEqual(drawn[3], 0, "the row under the pointer is drawn");
      // The window as a person sees it (a full-page capture would show rows never scrolled to).
      await screenshot(page, "19-deep-scrolled", { fullPage: false });
      assert.deepEqual(errors, [], "uncaught errors in the page");
      await page.close();
    } finally {
      await deep.stop();
    }
  });

  test("a span link opens the span's profile, and the whole profile is a click away", async () => {
    const traced = await startAggregator();
    try {
      await signIn(browser.context, traced);
      const at = ago(300);
      const cart = "00f067aa0ba902b7";
      const search = "5a561accaab40cf2";
      // Uploads of single spans, as the SDKs of Pyroscope's per-span era sent them: the span id
      // in the name's labels goes to the span index, not to a label.
      await traced.ingest(`api.cpu{span_id=${cart}}`, at, "main;http.serve;cart.handler;db.Query 300", { sampleRate: "100" });
      await traced.ingest(`api.cpu{span_id=${search}}`, at, "main;http.serve;search.handler;index.Scan 100", { sampleRate: "100" });
      await traced.ingest("api.cpu", at, "main;gc 100", { sampleRate: "100" });
      const range = `from=${at - 60}&until=${at + 60}`;
      const page = await browser.context.newPage();
      const errors = [];
      page.on("pageerror", (err) => errors.push(err));
      // The link a trace's span carries.
      await page.goto(`${traced.url}/?query=${encodeURIComponent("api.cpu{}")}&${range}&spanSelector=${cart}`);
      const banner = page.getByTestId("span-banner");
      await banner.waitFor();
      assert.match(await banner.innerText(), /Span profile: only the samples that ran in span/);
      assert.deepEqual(await banner.getByTestId("span-id").allInnerTexts(), [cart]);
      await page.getByTestId("flamegraph").locator("canvas").waitFor();
      await expectRootTotal(page, /\b300 total/);
      assert.equal((await frameAt(page, "flamegraph", 0.5, 3)).name, "cart.handler");
      const names = await tableNames(page);
      assert.ok(names.includes("db.Query") && !names.includes("index.Scan") && !names.includes("gc"), names.join(","));
      // Exports hold the span's samples only.
      const link = new URL(await page.getByTestId("export-collapsed").getAttribute("href"), traced.url);
      assert.equal(link.searchParams.get("spanSelector"), cart);
      const collapsed = await page.request.get(link.toString());
      assert.equal((await collapsed.text()).trim(), "main;http.serve;cart.handler;db.Query 300");
      // The timeline is the whole service's, the context the span ran in.
      await page.getByTestId("timeline").locator("path").first().waitFor();
      await screenshot(page, "20-span-profile");
      // The whole profile, one click away.
      await page.getByTestId("span-whole").click();
      await page.waitForURL((url) => !url.searchParams.has("spanSelector"));
      await expectRootTotal(page, /\b500 total/);
      await page.getByTestId("span-banner").waitFor({ state: "detached" });
      const all = await tableNames(page);
      assert.ok(all.includes("index.Scan") && all.includes("gc"), all.join(","));
      // Two spans at once, and a span with no samples says so.
      await page.goto(`${traced.url}/?query=${encodeURIComponent("api.cpu{}")}&${range}&spanSelector=${cart},${search}`);
      await page.getByTestId("span-banner").waitFor();
      assert.match(await page.getByTestId("span-banner").innerText(), /ran in 2 spans/);
      await expectRootTotal(page, /\b400 total/);
      await page.goto(`${traced.url}/?query=${encodeURIComponent("api.cpu{}")}&${range}&spanSelector=0000000000000001`);
      await page.getByTestId("no-samples").waitFor();
      assert.match(await page.getByTestId("no-samples").innerText(), /No samples of this span/);
      // No span label reached the series.
      const labels = await (await traced.fetch(`/labels?query=${encodeURIComponent("api.cpu{}")}`)).json();
      assert.ok(!labels.includes("span_id"), labels.join(","));
      assert.deepEqual(errors, [], "uncaught errors in the page");
      await page.close();
    } finally {
      await traced.stop();
    }
  });
});

async function expectRootTotal(page, pattern) {
  const deadline = Date.now() + 10_000;
  let last = "";
  while (Date.now() < deadline) {
    await page.mouse.move(0, 0);
    const canvas = page.getByTestId("flamegraph").locator("canvas");
    if (await canvas.count()) {
      last = (await frameAt(page, "flamegraph", 0.5, 0)).text;
      if (pattern.test(last)) return;
    }
    await page.waitForTimeout(100);
  }
  assert.fail(`root total ${JSON.stringify(last)} does not match ${pattern}`);
}

async function streamText(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}
