// A shopper's browser on the waiting page while the waiting room's Redis is restarted empty (issue 29,
// places that survive the store); started by main.rs.
//
// argv: <base URL of rankgate> <queue>
// Talks to main.rs over stdout: `WAITING <rank>` once the page shows the position (main.rs then restarts
// Redis, lets the others come back and answers a line on stdin), then `RECOVERED <rank> <reloads>` once
// the page shows the expected rank again after reloading itself, then `DONE`.
import { check, closeStdin, launchChromium, nextStdinLine, say } from "./driver.mjs";

const [base, queue] = process.argv.slice(2);

const browser = await launchChromium();
try {
  const context = await browser.newContext();
  const page = await context.newPage();
  let loads = 0;
  page.on("load", () => (loads += 1));
  const response = await page.goto(`${base}/wait/${queue}`);
  check(response.status() === 200, "the waiting page answers 200, got " + response.status());
  await page.waitForSelector("#position");
  const rank = Number(await page.getAttribute("#position", "data-rank"));
  const cookies = await context.cookies();
  const ticket = cookies.find((c) => c.name === `rankgate_ticket_${queue}`);
  check(ticket && ticket.httpOnly, "the page keeps its ticket in an HttpOnly cookie");
  check(
    (await page.evaluate(() => document.cookie)).indexOf("rankgate_ticket_") < 0,
    "the page's script cannot read the ticket",
  );
  say(`WAITING ${rank}`);
  const expected = Number(await nextStdinLine()); // main.rs restarted Redis; the others are back
  const loadsBefore = loads;
  const deadline = Date.now() + 90_000;
  for (;;) {
    check(Date.now() < deadline, `back at rank ${expected} within 90 s (loads ${loads})`);
    const now = await page.getAttribute("#position", "data-rank", { timeout: 500 }).catch(() => null);
    if (loads > loadsBefore && now !== null && Number(now) === expected) break;
    await page.waitForTimeout(200);
  }
  say(`RECOVERED ${expected} ${loads - loadsBefore}`);
  say("DONE");
} finally {
  await browser.close();
  closeStdin();
}
