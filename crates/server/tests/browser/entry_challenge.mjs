// A shopper's browser meeting the entry challenges of issue 28; started by main.rs.
//
// argv: <base URL of rankgate> <PoW queue> <CAPTCHA queue>
// Says on stdout, one line each:
//   `POW_ENTERED <rank> <millis>`  the challenge page solved its proof of work in a Web Worker (the
//                                  progress bar moving) and the browser landed on the waiting page
//   `NOSCRIPT`                     with scripts off the page explains that the queue needs them
//   `CAPTCHA_PASSED <rank>`        the provider's widget (main.rs's local stand-in) said human: in line
//   `CAPTCHA_FAILED`               it said bot: still on the challenge page, told why
//   `DONE`
import { check, closeStdin, launchChromium, say } from "./driver.mjs";

const [base, powQueue, captchaQueue] = process.argv.slice(2);

const browser = await launchChromium();
try {
  // Proof of work: the first view is the challenge page (428), which solves and posts by itself.
  {
    const context = await browser.newContext();
    const page = await context.newPage();
    // At this difficulty the worker may be done before a locator could look: read the page as served
    // first (this request shares the context's cookies: it issues the visitor the page then uses).
    const probe = await context.request.get(`${base}/wait/${powQueue}`, { headers: { accept: "text/html" } });
    const served = await probe.text();
    check(probe.status() === 428, "the first view asks for work: 428, got " + probe.status());
    check(served.includes("Checking your browser") && served.includes("<progress id=\"work\""), "the page says what it does: " + served);
    const started = Date.now();
    const first = await page.goto(`${base}/wait/${powQueue}`);
    check(first.status() === 428, "the page view asks for work too: 428, got " + first.status());
    await page.waitForSelector("#position", { timeout: 60_000 });
    const millis = Date.now() - started;
    const rank = Number(await page.getAttribute("#position", "data-rank"));
    check(page.url() === `${base}/wait/${powQueue}`, "after the post, a 303 back to the page: " + page.url());
    const cookies = await context.cookies();
    check(cookies.some((c) => c.name === `rankgate_ticket_${powQueue}`), "the page keeps its ticket");
    // A reload is a returning member: no second challenge, same place.
    const again = await page.reload();
    check(again.status() === 200, "a reload asks no new work, got " + again.status());
    check(Number(await page.getAttribute("#position", "data-rank")) === rank, "same place after reload");
    say(`POW_ENTERED ${rank} ${millis}`);
    await context.close();
  }
  // Scripts off: the page explains.
  {
    const context = await browser.newContext({ javaScriptEnabled: false });
    const page = await context.newPage();
    const response = await page.goto(`${base}/wait/${powQueue}`);
    check(response.status() === 428, "scripts off still gets the challenge page");
    const text = await page.textContent("#needs-scripts");
    check(text && text.includes("needs JavaScript"), "the page says the queue needs scripts: " + text);
    say("NOSCRIPT");
    await context.close();
  }
  // CAPTCHA, passed.
  {
    const context = await browser.newContext();
    const page = await context.newPage();
    const first = await page.goto(`${base}/wait/${captchaQueue}`);
    check(first.status() === 428, "the first view shows the CAPTCHA: 428, got " + first.status());
    await page.click("#fake-human");
    await page.waitForSelector("#position", { timeout: 30_000 });
    say(`CAPTCHA_PASSED ${await page.getAttribute("#position", "data-rank")}`);
    await context.close();
  }
  // CAPTCHA, failed.
  {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(`${base}/wait/${captchaQueue}`);
    await page.click("#fake-bot");
    await page.waitForSelector("#problem", { timeout: 30_000 });
    const problem = await page.textContent("#problem");
    check(problem.includes("refused this token"), "the page says why: " + problem);
    check((await page.$("#position")) === null, "no place for a bot");
    check((await page.$("#fake-human")) !== null, "the widget is shown again");
    say("CAPTCHA_FAILED");
    await context.close();
  }
  say("DONE");
} finally {
  await browser.close();
  closeStdin();
}
