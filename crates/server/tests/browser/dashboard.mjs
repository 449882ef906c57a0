// The dashboard (issue 30) in Chromium; started by dashboard.rs.
//
// argv: <local base URL> <the same server by a non-loopback address> <base URL of a server with admin
//       keys> <its admin key> <screenshot directory>
// 1. From the non-loopback address (no admin key set): the page says to open it from localhost or set
//    an admin key. From localhost, before any queue: "No queue yet: create one with PUT …". Says
//    `NO_QUEUE` and waits for `go` (dashboard.rs makes a sale meanwhile).
// 2. Reloads and waits for the queues' charts; says `DRAWN <json>` (the queue table, every chart's
//    series with the times they were drawn at, every legend), which dashboard.rs compares with the
//    JSON history, and saves `dashboard.png`.
// 3. On the keyed server: asks for a key, says a wrong one was refused, takes the right one, which
//    survives a reload (sessionStorage) until "Forget the admin key". Then `DONE`.
// Throughout: the page runs under its CSP (no violation), loads nothing from elsewhere.
import { check, closeStdin, launchChromium, nextStdinLine, say } from "./driver.mjs";

const [local, remote, keyed, adminKey, shots] = process.argv.slice(2);

const browser = await launchChromium();
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const problems = [];
  page.on("console", (message) => {
    if (message.type() === "error" && !/Failed to load resource/.test(message.text())) problems.push(message.text());
  });
  page.on("pageerror", (error) => problems.push(String(error)));
  const requests = [];
  page.on("request", (request) => requests.push(request.url()));
  const guidance = async (state) => {
    await page.waitForSelector(`#guidance[data-state="${state}"]`, { timeout: 20000 });
    return (await page.textContent("#guidance")).replace(/\s+/g, " ");
  };

  // 1. Where the page cannot show the queues, it says what to do.
  const response = await page.goto(`${remote}/dashboard`);
  check(response.status() === 200, "the dashboard answers 200");
  const csp = response.headers()["content-security-policy"] || "";
  check(/script-src 'sha256-[A-Za-z0-9+/=]+'/.test(csp), "the page's script is allowed by hash: " + csp);
  check(csp.includes("connect-src 'self'"), "calls go to this origin only: " + csp);
  let text = await guidance("loopback-only");
  check(/open this page from localhost/i.test(text), "says to open from localhost: " + text);
  check(/set an admin key/i.test(text), "says to set an admin key: " + text);
  check(await page.isHidden("#queues"), "no queue table without access");

  await page.goto(`${local}/dashboard`);
  text = await guidance("no-queue");
  check(text.includes("No queue yet: create one with PUT /v1/admin/queues/{queue}"), "no-queue guidance: " + text);
  check(await page.isVisible("#chart-events svg[data-chart=events]"), "the ingest charts are there without a queue");
  say("NO_QUEUE");
  check((await nextStdinLine()) === "go", "dashboard.rs says go");

  // 2. With a sale: the queue list and the charts.
  await page.reload();
  await page.waitForSelector('[data-queue-card="summer-sale"] svg[data-chart=flow]', { timeout: 20000 });
  check(await page.isHidden("#guidance"), "no guidance once there are queues");
  const drawn = await page.evaluate(() => {
    const rows = {};
    for (const row of document.querySelectorAll("#queue-table tbody tr")) {
      rows[row.dataset.queue] = [...row.cells].slice(1, 8).map((cell) => cell.textContent);
    }
    const chartsOf = (root) => {
      const charts = {};
      for (const svg of root.querySelectorAll("svg[data-chart]")) {
        const box = svg.getBoundingClientRect();
        const series = {};
        for (const g of svg.querySelectorAll("g[data-series]")) {
          const list = (csv) => (csv === "" ? [] : csv.split(",").map((v) => (v === "" ? null : Number(v))));
          series[g.dataset.series] = {
            times: list(g.dataset.times),
            values: list(g.dataset.values),
            marks: g.querySelectorAll("polyline, circle").length,
            legend: svg.parentElement.querySelector(`[data-legend="${g.dataset.series}"]`).textContent,
          };
        }
        const labels = [...svg.querySelectorAll("text")].map((t) => t.textContent);
        charts[svg.dataset.chart] = { width: box.width, height: box.height, series, labels };
      }
      return charts;
    };
    const queues = {};
    for (const card of document.querySelectorAll("[data-queue-card]")) {
      queues[card.dataset.queueCard] = card.querySelector("[data-idle]") ? "idle" : chartsOf(card);
    }
    return { rows, ingest: chartsOf(document.getElementById("ingest")), queues };
  });
  for (const charts of [drawn.ingest, ...Object.values(drawn.queues).filter((q) => q !== "idle")]) {
    for (const [name, chart] of Object.entries(charts)) {
      check(chart.width > 300 && chart.height > 80, `${name} is drawn at a readable size`);
      check(chart.labels.some((label) => /^\d\d:\d\d(:\d\d)?$/.test(label)), `${name} has clock times on its x axis`);
      check(chart.labels.includes("0"), `${name} has a y axis from 0`);
      for (const [key, series] of Object.entries(chart.series)) {
        check(series.times.length === series.values.length, `${name}/${key}: a time for each value`);
        if (series.values.some((v) => v !== null)) check(series.marks > 0, `${name}/${key} draws its values`);
      }
    }
  }
  await page.screenshot({ path: `${shots}/dashboard.png`, fullPage: true });
  say("DRAWN " + JSON.stringify(drawn));

  // 3. A server with admin keys: the page asks for one.
  await page.goto(`${keyed}/dashboard`);
  text = await guidance("need-key");
  check(/enter an admin key/i.test(text), "asks for the admin key: " + text);
  await page.fill("#key", "not-the-key");
  await page.click("#key-form button[type=submit]");
  text = await guidance("key-refused");
  check(/refused/.test(text), "says the key was refused: " + text);
  await page.fill("#key", adminKey);
  await page.click("#key-form button[type=submit]");
  await guidance("no-queue");
  await page.reload();
  await guidance("no-queue");
  check(await page.isVisible("#forget"), "the key is kept for the tab, and can be forgotten");
  await page.click("#forget");
  await guidance("need-key");

  check(problems.length === 0, "no script error or CSP violation: " + problems.join(" | "));
  const origins = [local, remote, keyed];
  check(requests.every((url) => origins.some((o) => url.startsWith(o))), "nothing is loaded from elsewhere: " + requests);
  say("DONE");
} finally {
  await browser.close();
  closeStdin();
}
