// The sale report's page (issue 28, SPEC 2.5) in Chromium; started by report_page.rs.
//
// argv: <base URL of rankgate> <queue> <screenshot directory>
// Opens /admin/queues/<queue>/report at a desktop width, checks every chart is drawn (an SVG with a
// line or dots for each series) with no script and nothing loaded from elsewhere, saves `report.png`,
// and says `DRAWN <json>`: the totals as shown and each chart's series as drawn, which report_page.rs
// compares with the JSON report. Then `DONE`.
import { check, closeStdin, launchChromium, say } from "./driver.mjs";

const [base, queue, shots] = process.argv.slice(2);

const browser = await launchChromium();
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  const requests = [];
  page.on("request", (request) => requests.push(request.url()));
  const response = await page.goto(`${base}/admin/queues/${queue}/report`);
  check(response.status() === 200, "the report page answers 200, got " + response.status());
  check(
    (response.headers()["content-type"] || "").startsWith("text/html"),
    "the page is HTML",
  );
  check(requests.every((url) => url.startsWith(base)), "nothing is loaded from elsewhere: " + requests);
  check((await page.locator("script").count()) === 0, "the page runs no script");
  check((await page.textContent("[data-queue]")) === queue, "the page names its queue");

  const drawn = await page.evaluate(() => {
    const totals = {};
    for (const dd of document.querySelectorAll("[data-total]")) totals[dd.dataset.total] = dd.textContent;
    const charts = {};
    for (const svg of document.querySelectorAll("svg[data-chart]")) {
      const box = svg.getBoundingClientRect();
      const series = {};
      for (const g of svg.querySelectorAll("g[data-series]")) {
        series[g.dataset.series] = {
          values: g.dataset.values.split(",").map((v) => (v === "" ? null : Number(v))),
          marks: g.querySelectorAll("polyline, circle").length,
          color: getComputedStyle(g).stroke,
        };
      }
      charts[svg.dataset.chart] = { width: box.width, height: box.height, series };
    }
    return { totals, charts };
  });
  for (const [name, chart] of Object.entries(drawn.charts)) {
    check(chart.width > 600 && chart.height > 100, `${name} is drawn at a readable size`);
    for (const [key, series] of Object.entries(chart.series)) {
      if (series.values.some((v) => v !== null)) {
        check(series.marks > 0, `${name}/${key} draws its values`);
      }
    }
  }
  await page.screenshot({ path: `${shots}/report.png`, fullPage: true });
  say("DRAWN " + JSON.stringify(drawn));
  say("DONE");
} finally {
  await browser.close();
  closeStdin();
}
