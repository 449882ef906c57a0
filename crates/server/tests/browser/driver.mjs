// What every browser script of this folder shares: the line protocol with main.rs (`say` a line on
// stdout, `nextStdinLine` for main.rs's answer), `check` (a failed one throws: the process exits non-zero
// and main.rs fails with stderr), and the headless Chromium it drives (Debian's, through playwright-core).
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";

export const say = (line) => process.stdout.write(line + "\n");

export const check = (ok, what) => {
  if (!ok) throw new Error("check failed: " + what);
};

const stdinLines = createInterface({ input: process.stdin });

export const nextStdinLine = () => new Promise((resolve) => stdinLines.once("line", resolve));

// Stops reading stdin, which would otherwise keep node alive once the script is done.
export const closeStdin = () => stdinLines.close();

export const launchChromium = () =>
  chromium.launch({
    executablePath: process.env.RANKGATE_CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
