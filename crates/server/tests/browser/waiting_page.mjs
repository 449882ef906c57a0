// Drives Debian's chromium (headless, playwright-core) through the waiting page; started by main.rs.
//
// argv: <base URL of rankgate> <queue> <quiet queue> <polled queue> <screenshot dir>
// Talks to main.rs over stdout, one line per step: `WAITING <queue> <rank>` (main.rs then resumes that
// queue's admission and answers a line on stdin), `RANKS <r1,r2,...>`, `ADMITTED`, `ORDERED`,
// `SECOND_USE <status>`, `SCRIPTS_OFF ok`, `POLLED <r1,...>`, `DONE`.
// Any failed check throws: the process exits non-zero and main.rs fails with stderr.
import { check, closeStdin, launchChromium, nextStdinLine, say } from "./driver.mjs";

const [base, queue, quietQueue, polledQueue, shots] = process.argv.slice(2);

const browser = await launchChromium();
try {
  // ---- scripts on, 320 px wide: watch the position fall, be admitted, continue by itself ----
  const context = await browser.newContext({ viewport: { width: 320, height: 640 } });
  const page = await context.newPage();
  const response = await page.goto(`${base}/wait/${queue}`);
  check(response.status() === 200, "the waiting page answers 200, got " + response.status());
  await page.waitForSelector("#position");
  const firstText = await page.textContent("#position");
  const firstRank = Number(await page.getAttribute("#position", "data-rank"));
  check(/You are number \d+/.test(firstText), "position text: " + firstText);
  check(firstRank >= 2, "the browser's member starts behind the others, rank " + firstRank);
  check((await page.getAttribute("#status", "aria-live")) === "polite", "aria-live on the position");
  const logoWidth = await page.evaluate(() => document.querySelector("img.logo")?.naturalWidth ?? 0);
  check(logoWidth > 0, "the configured logo loads (the CSP allows it)");
  check(/keep your place/.test(await page.textContent("#keep-open")), "keep-this-tab-open text");
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth);
  check(overflow <= 320, "no horizontal scrolling at 320 px, scrollWidth " + overflow);
  // Keyboard: the waiting page's control is reachable with Tab.
  await page.keyboard.press("Tab");
  check((await page.evaluate(() => document.activeElement.id)) === "refresh", "Tab reaches #refresh");
  say(`WAITING ${queue} ${firstRank}`);
  await nextStdinLine(); // main.rs resumed admission

  // The script updates #position in place from the stream; sample it until the admitted page shows.
  const ranks = [firstRank];
  const deadline = Date.now() + 60_000;
  for (;;) {
    check(Date.now() < deadline, "admitted within 60 s; ranks seen " + ranks.join(","));
    const admitted = await page.$("#admitted").catch(() => null);
    if (admitted) break;
    const rank = await page.getAttribute("#position", "data-rank", { timeout: 500 }).catch(() => null);
    if (rank !== null && rank !== "" && Number(rank) !== ranks[ranks.length - 1]) {
      ranks.push(Number(rank));
      // The waiting state as members see it while admission runs: moved up, progress and estimate shown.
      if (ranks.length === 3) await page.screenshot({ path: `${shots}/waiting.png`, fullPage: true });
    }
    await page.waitForTimeout(100);
  }
  say("RANKS " + ranks.join(","));
  for (let i = 1; i < ranks.length; i++) check(ranks[i] < ranks[i - 1], "ranks only fall: " + ranks.join(","));
  check(ranks.length >= 3, "the position fell on the page before admission: " + ranks.join(","));

  // The admitted page: continue control focusable by keyboard, screenshot, then it continues by itself.
  await page.waitForSelector("#continue");
  // It has the focus on arrival (autofocus), and Tab from the top of the page reaches it too.
  check((await page.evaluate(() => document.activeElement.id)) === "continue", "#continue has the focus");
  await page.mouse.click(2, 2); // moves the focus (and Tab's starting point) to the page's top corner
  check((await page.evaluate(() => document.activeElement.id)) !== "continue", "the click took the focus");
  await page.keyboard.press("Tab");
  check((await page.evaluate(() => document.activeElement.id)) === "continue", "Tab reaches #continue");
  const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
  check(outline !== "none", "the focused continue link shows a focus outline, got " + outline);
  await page.screenshot({ path: `${shots}/admitted.png`, fullPage: true });
  const cookies = await context.cookies();
  const token = cookies.find((c) => c.name === `rankgate_token_${queue}`);
  check(token && token.httpOnly && token.sameSite === "Lax" && token.path === "/", "HttpOnly token cookie");
  const visitor = cookies.find((c) => c.name === "rankgate_visitor");
  check(visitor && visitor.httpOnly && visitor.sameSite === "Lax", "HttpOnly visitor cookie");
  say("ADMITTED");

  await page.waitForURL(`${base}/shop/checkout`, { timeout: 30_000 });
  await page.waitForSelector("#order");
  check(/Order placed/.test(await page.textContent("#order")), "the shop's order page");
  say("ORDERED");
  const again = await page.reload();
  say("SECOND_USE " + again.status());
  check(again.status() === 401, "a consumed token does not buy a second order");
  await context.close();

  // ---- scripts off: the server-rendered position and a refresh meta tag ----
  const quiet = await browser.newContext({ viewport: { width: 320, height: 640 }, javaScriptEnabled: false });
  const still = await quiet.newPage();
  await still.goto(`${base}/wait/${quietQueue}`);
  const text = await still.textContent("#position");
  check(/You are number \d+/.test(text), "scripts-off position text: " + text);
  const refresh = await still.getAttribute('meta[http-equiv="refresh"]', "content");
  check(/^\d+;url=\?first=\d+$/.test(refresh || ""), "refresh meta: " + refresh);
  // and it really reloads by itself, carrying the first rank for the progress bar
  await still.waitForURL(/\?first=\d+$/, { timeout: 15_000 });
  check(/You are number \d+/.test(await still.textContent("#position")), "position after the reload");
  await quiet.close();
  say("SCRIPTS_OFF ok");

  // ---- no EventSource (old browser, or a proxy that breaks streams): the page polls instead ----
  const polling = await browser.newContext({ viewport: { width: 320, height: 640 } });
  await polling.addInitScript(() => {
    delete window.EventSource;
  });
  const polled = await polling.newPage();
  const requests = [];
  polled.on("request", (request) => requests.push(new URL(request.url()).pathname));
  await polled.goto(`${base}/wait/${polledQueue}`);
  const polledRanks = [Number(await polled.getAttribute("#position", "data-rank"))];
  say(`WAITING ${polledQueue} ${polledRanks[0]}`);
  await nextStdinLine();
  const polledDeadline = Date.now() + 60_000;
  for (;;) {
    check(Date.now() < polledDeadline, "admitted by polling within 60 s: " + polledRanks.join(","));
    if (await polled.$("#admitted").catch(() => null)) break;
    const rank = await polled.getAttribute("#position", "data-rank", { timeout: 500 }).catch(() => null);
    if (rank !== null && rank !== "" && Number(rank) !== polledRanks[polledRanks.length - 1]) {
      polledRanks.push(Number(rank));
    }
    await polled.waitForTimeout(100);
  }
  say("POLLED " + polledRanks.join(","));
  check(polledRanks.length >= 2, "the position fell by polling: " + polledRanks.join(","));
  check(!requests.some((path) => path.endsWith("/events")), "no stream was opened without EventSource");
  const polls = requests.filter((path) => /^\/v1\/queues\/[^/]+\/entries\/[^/]+$/.test(path));
  check(polls.length >= 2, "the page polled the position route: " + requests.join(" "));
  await polling.close();
  say("DONE");
} finally {
  closeStdin();
  await browser.close();
}
