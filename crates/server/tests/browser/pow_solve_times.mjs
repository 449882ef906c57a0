// How long Chromium takes to solve rankgate's proof-of-work challenges (issue 28), in the waiting page's
// own Web Worker (/wait-assets/pow-worker.js). Run by bench/pow_browser.sh against a running server.
//
// argv: <base URL of rankgate> <queue> <difficulties, comma-separated> <solves per difficulty, comma-separated>
// Prints one line per difficulty: `<difficulty> <solves> <median ms> <p90 ms> <mean hashes> <accepted>`,
// where accepted counts the solutions the server took as entries.
import { check, closeStdin, launchChromium, say } from "./driver.mjs";

const [base, queue, difficultiesArg, countsArg] = process.argv.slice(2);
const difficulties = difficultiesArg.split(",").map(Number);
const counts = countsArg.split(",").map(Number);

const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];

const browser = await launchChromium();
try {
  const page = await (await browser.newContext()).newPage();
  await page.goto(`${base}/healthz`);
  for (const [index, difficulty] of difficulties.entries()) {
    const put = await page.request.put(`${base}/v1/admin/queues/${queue}`, {
      data: { entryChallenge: "pow", powDifficulty: difficulty, paused: true },
    });
    check(put.ok(), "admin PUT " + put.status());
    const times = [];
    let hashes = 0;
    let accepted = 0;
    for (let i = 0; i < counts[index]; i++) {
      const solved = await page.evaluate(async (queue) => {
        const challenge = await (await fetch(`/v1/queues/${queue}/challenge`)).json();
        const worker = new Worker("/wait-assets/pow-worker.js");
        const started = performance.now();
        const result = await new Promise((resolve) => {
          worker.onmessage = (event) => {
            if (event.data.nonce !== undefined) resolve(event.data);
          };
          worker.postMessage({ challenge: challenge.challenge, difficulty: challenge.difficulty });
        });
        const millis = performance.now() - started;
        worker.terminate();
        const entry = await fetch(`/v1/queues/${queue}/entries`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-queue-challenge": `${challenge.challenge}:${result.nonce}` },
          body: "{}",
        });
        return { millis, hashes: result.hashes, status: entry.status };
      }, queue);
      times.push(solved.millis);
      hashes += solved.hashes;
      if (solved.status === 200) accepted += 1;
    }
    times.sort((a, b) => a - b);
    say(
      `${difficulty} ${times.length} ${quantile(times, 0.5).toFixed(1)} ${quantile(times, 0.9).toFixed(1)} ` +
        `${Math.round(hashes / times.length)} ${accepted}`,
    );
  }
} finally {
  await browser.close();
  closeStdin();
}
