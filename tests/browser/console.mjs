// Drives the console in a real browser (Debian's headless Chromium through
// playwright-core): sign-in, inbox, thread, reply, compose, directory, a
// phone-sized screen, sign-out and the operator overview, against the real
// server that tests/console_browser.rs started. Takes the screenshots the
// README shows. Any failed check, page error, CSP violation, dialog (a
// script that ran) or failed request ends the run with a non-zero status.
//
// Environment: PHONE_URL, BOB_TOKEN, OPERATOR_TOKEN, SCREENSHOT_DIR,
// CHROMIUM (default /usr/bin/chromium).

import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const base = process.env.PHONE_URL;
const bobToken = process.env.BOB_TOKEN;
const operatorToken = process.env.OPERATOR_TOKEN;
const shots = process.env.SCREENSHOT_DIR;
mkdirSync(shots, { recursive: true });

const problems = [];
let step = "start";
function check(ok, what) {
  if (!ok) throw new Error(`${step}: ${what}`);
}
function log(what) {
  console.log(`browser: ok  ${what}`);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  // This machine's network is closed: no background connections.
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});

async function watched(context) {
  const page = await context.newPage();
  page.on("pageerror", (e) => problems.push(`${step}: page error ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`${step}: console error ${m.text()}`);
  });
  page.on("dialog", async (d) => {
    problems.push(`${step}: a dialog opened (a script ran): ${d.message()}`);
    await d.dismiss();
  });
  page.on("requestfailed", (r) => problems.push(`${step}: request failed ${r.url()}`));
  page.on("response", (r) => {
    if (r.status() >= 500) problems.push(`${step}: ${r.status()} from ${r.url()}`);
  });
  return page;
}

try {
  const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  const page = await watched(context);

  step = "sign-in";
  await page.goto(`${base}/console`);
  check(page.url().endsWith("/console/sign-in"), `not sent to sign-in: ${page.url()}`);
  await page.fill("#name", "bob");
  await page.fill("#token", bobToken);
  await page.screenshot({ path: join(shots, "sign-in.png") });
  await Promise.all([page.waitForURL("**/console/inbox"), page.click("button[type=submit]")]);
  check(page.url().indexOf("token") === -1, "the token is in the URL");
  check((await page.textContent("header.top")).includes("Signed in as bob"), "no signed-in header");
  log("signed in through the form");

  step = "inbox";
  const rows = page.locator("ul.mail li");
  check((await rows.count()) === 4, `expected 4 messages (3 unread, 1 read), got ${await rows.count()}`);
  check((await page.textContent("main")).includes("3 unread"), "unread count");
  // A subject with markup shows as its characters.
  check((await page.textContent("ul.mail")).includes("<b>deploy</b> window"), "markup subject not shown as text");
  check((await page.locator("ul.mail b").count()) === 0, "a <b> element came from a subject");
  await page.screenshot({ path: join(shots, "inbox.png") });
  log("inbox lists 4 messages, 3 unread, markup shown as text");

  step = "thread";
  await Promise.all([
    page.waitForURL("**/console/messages/**"),
    page.click("ul.mail li a:has-text('deploy')"),
  ]);
  const body = await page.textContent("article.focus pre.body");
  check(body.includes("<script>alert('x')</script>"), `body not shown as text: ${body}`);
  check((await page.locator("article.focus img").count()) === 0, "an <img> came from a body");
  check((await page.locator("article.message").count()) === 1, "a thread of one message");
  await page.fill("#body", "Tuesday works. — bob's human");
  await page.screenshot({ path: join(shots, "thread.png"), fullPage: true });
  await Promise.all([page.waitForURL("**sent=1"), page.click("form.compose button[type=submit]")]);
  check((await page.textContent("p.notice")).includes("Sent to alice."), "no sent notice");
  check((await page.locator("article.message").count()) === 2, "the reply joined the thread");
  log("thread shows the conversation; the reply joined it");

  step = "compose";
  await page.click("nav >> text=Write");
  await page.fill("#to", "alice");
  await page.fill("#subject", "Status");
  await page.fill("#body", "All green on our side.\nSecond line.");
  await page.screenshot({ path: join(shots, "compose.png") });
  await Promise.all([page.waitForURL("**sent=1"), page.click("form.compose button[type=submit]")]);
  log("wrote a new message as the agent");

  step = "sent";
  await page.click("nav >> text=Sent");
  check((await page.locator("ul.mail li").count()) === 3, "three sent messages (one by the agent itself)");
  log("sent mail lists all three, with their state");

  step = "directory";
  await page.click("nav >> text=Directory");
  await page.fill("#q", "deploys");
  await Promise.all([page.waitForURL("**q=deploys**"), page.click("form.search button")]);
  check((await page.textContent("ul.cards")).includes("alice"), "alice not found");
  await page.screenshot({ path: join(shots, "directory.png") });
  log("directory search finds alice");

  step = "phone-sized";
  const phone = await watched(
    await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true }),
  );
  await phone.context().addCookies(await context.cookies());
  await phone.goto(`${base}/console/inbox`);
  const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 0, `the page is ${overflow}px wider than a phone's screen`);
  await phone.screenshot({ path: join(shots, "inbox-phone.png") });
  log("inbox fits a phone's screen");

  step = "sign-out";
  await Promise.all([page.waitForURL("**signed_out=1"), page.click("text=Sign out")]);
  check((await page.textContent("p.notice")).includes("Signed out."), "no signed-out notice");
  await page.goto(`${base}/console/inbox`);
  check(page.url().endsWith("/console/sign-in"), "still signed in after signing out");
  await phone.goto(`${base}/console/inbox`);
  check(phone.url().endsWith("/console/sign-in"), "the other tab's session survived sign-out");
  log("signed out, everywhere");

  step = "operator";
  await page.goto(`${base}/console/operator`);
  await page.fill("#admin_token", operatorToken);
  await Promise.all([page.waitForURL("**/console/operator"), page.click("button[type=submit]")]);
  check((await page.locator("svg.chart rect").count()) === 14, "a bar per day");
  // Drawn, not only present: today's bar stands, the scale is readable.
  const today = await page.locator("svg.chart rect").last().boundingBox();
  check(today && today.height > 20, `today's bar is not drawn: ${JSON.stringify(today)}`);
  check(await page.locator("svg.chart text").first().isVisible(), "the scale's labels are not drawn");
  check((await page.textContent("main")).includes("Largest unread backlogs"), "backlog table");
  await page.screenshot({ path: join(shots, "overview.png"), fullPage: true });
  log("operator overview with its chart");
} catch (e) {
  problems.push(e.message);
} finally {
  await browser.close();
}

if (problems.length) {
  for (const p of problems) console.log(`browser: FAIL ${p}`);
  process.exit(1);
}
console.log("browser: all steps passed");
