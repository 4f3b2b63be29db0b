// The built-in console in real headless Chromium, run by `scripts/test browser`:
// a real server with the `mock` profile and `--console`; a person's path through the page —
// create a session, a prompt whose answer streams chunks and a tool call, a permission answered
// from the page, a long turn stopped, a reload showing the same transcript, its download as JSON
// and Markdown, a phone's width, a wrong token's clear error, and a hostile agent's invalid
// currency code and forged Markdown. Screenshots go to $SCREENSHOT_DIR.
//
// env: HARNESS_BIN (the agent-harness binary), CHROMIUM (its executable), NPM_PREFIX (where
// playwright-core is installed), SCREENSHOT_DIR.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, mkdirSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

const { HARNESS_BIN, CHROMIUM, NPM_PREFIX, SCREENSHOT_DIR } = process.env;
for (const [name, value] of Object.entries({ HARNESS_BIN, CHROMIUM, NPM_PREFIX, SCREENSHOT_DIR })) {
  if (!value) throw new Error(`${name} must be set (scripts/test browser sets it)`);
}
const { chromium } = await import(join(NPM_PREFIX, "node_modules/playwright-core/index.mjs"));

// Every wait in the page is for something to appear, bounded by this.
const WAIT = 20_000;
const work = mkdtempSync(join(tmpdir(), "agent-harness-browser-"));
const servers = [];
let browser;

function freePort() {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

/** Starts `agent-harness serve` and resolves once it logs that it serves gRPC-Web. */
async function startServer(name, args, port) {
  port ??= await freePort();
  const data = join(work, name);
  mkdirSync(data, { recursive: true });
  // Where its sessions work: apart from the server's data dir (a cwd never lies in it).
  const code = join(work, `${name}-code`);
  mkdirSync(code, { recursive: true });
  const child = spawn(HARNESS_BIN, ["serve", "--listen", `127.0.0.1:${port}`, "--data-dir", data, ...args], {
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, RUST_LOG: "info" },
  });
  servers.push(child);
  let log = "";
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not start:\n${log}`)), WAIT);
    child.stderr.on("data", (chunk) => {
      log += chunk;
      if (log.includes("serving gRPC-Web")) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited with ${code}:\n${log}`));
    });
  });
  return { url: `http://127.0.0.1:${port}/`, data, code, port, child };
}

before(async () => {
  mkdirSync(SCREENSHOT_DIR, { recursive: true });
  // Root in a container has no user namespace for Chromium's sandbox.
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
  for (const child of servers) child.kill("SIGKILL");
  rmSync(work, { recursive: true, force: true });
});

/** The prompt box, by its label. */
const promptBox = (page) => page.getByRole("textbox", { name: /^Prompt/ });

/** The transcript's text, once the stream has caught up. */
async function transcriptText(page) {
  await page.locator("#live", { hasText: "live" }).waitFor({ timeout: WAIT });
  return page.locator("#transcript").innerText();
}

test("a person drives a mock session from the console", async () => {
  const server = await startServer("console", ["--console"]);
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  await page.goto(server.url);

  // Create a session (the form is reached by its labels, as a screen reader would).
  await page.getByText("New session").click();
  await page.getByLabel("Working directory").fill(server.code);
  await page.getByLabel("Name").fill("fix the build");
  await page.getByRole("button", { name: "Create session" }).click();
  await page.locator("#session-title", { hasText: "fix the build" }).waitFor({ timeout: WAIT });
  await page.locator("#sessions a", { hasText: "fix the build" }).waitFor({ timeout: WAIT });

  // A prompt whose answer streams chunks, a tool call, a plan, then asks for permission.
  await promptBox(page).fill(
    "Build and test the project\n@chunks 3 24\n@tool cargo-build\n@plan inspect|fix|verify\n@permission Run cargo test",
  );
  await page.getByRole("button", { name: "Send", exact: true }).click();
  const agent = page.locator("article.message.agent").first();
  for (const chunk of ["#0:", "#1:", "#2:"]) {
    await agent.getByText(chunk).first().waitFor({ timeout: WAIT });
  }
  await page.locator('[data-tool="cargo-build"] .tool-status', { hasText: "completed" }).waitFor({ timeout: WAIT });
  await page.locator("ol.plan li", { hasText: "verify" }).waitFor({ timeout: WAIT });
  const allow = page.getByRole("button", { name: "Allow once" });
  await allow.waitFor({ timeout: WAIT });
  await page.locator("#session-status", { hasText: "awaiting input" }).waitFor({ timeout: WAIT });
  await page.screenshot({ path: join(SCREENSHOT_DIR, "console.png") });

  // Answer the permission from the page, with the keyboard.
  await allow.focus();
  await page.keyboard.press("Enter");
  await page.locator("fieldset.permission.answered", { hasText: "allow-once" }).waitFor({ timeout: WAIT });
  await agent.locator("footer.stop", { hasText: "end turn" }).waitFor({ timeout: WAIT });

  // A question (elicitation) answered in its form.
  await promptBox(page).fill("Who is asking?\n@elicit form");
  await page.getByRole("button", { name: "Send", exact: true }).click();
  const question = page.locator("form.elicitation.pending");
  await question.getByLabel("Name").fill("Ada");
  // The page redraws while the person types (here: a prompt queued meanwhile); what they
  // typed stays.
  await promptBox(page).fill("Queued while answering");
  await page.locator("#prompt-form").getByRole("button", { name: "Send", exact: true }).click();
  await page.locator("#queue li", { hasText: "Queued while answering" }).waitFor({ timeout: WAIT });
  assert.equal(await question.getByLabel("Name").inputValue(), "Ada");
  await question.getByRole("button", { name: "Send" }).click();
  await page.locator("fieldset.elicitation.answered").waitFor({ timeout: WAIT });
  await page.locator("article.message.agent").nth(1).locator("footer.stop", { hasText: "end turn" }).waitFor({ timeout: WAIT });
  await page.locator("article.message.agent").nth(2).locator("footer.stop", { hasText: "end turn" }).waitFor({ timeout: WAIT });

  // A long turn, sent with Ctrl+Enter, then stopped.
  await promptBox(page).fill("Wait for me\n@wait-cancel");
  await promptBox(page).press("Control+Enter");
  await page.locator("#session-status", { hasText: "running" }).waitFor({ timeout: WAIT });
  // While it runs, a prompt waits in the queue: edit it, then remove it.
  await promptBox(page).fill("Then this");
  await page.getByRole("button", { name: "Send", exact: true }).click();
  const queued = page.locator("#queue li", { hasText: "Then this" });
  await queued.waitFor({ timeout: WAIT });
  page.once("dialog", (dialog) => dialog.accept("Then this, edited"));
  await page.getByRole("button", { name: "Edit queued prompt 1" }).click();
  await page.locator("#queue li", { hasText: "Then this, edited" }).waitFor({ timeout: WAIT });
  await page.getByRole("button", { name: "Remove queued action 1" }).click();
  await page.locator("#queue-section").waitFor({ state: "hidden", timeout: WAIT });
  await page.getByRole("button", { name: "Stop" }).click();
  await page
    .locator("article.message.agent")
    .last()
    .locator("footer.stop", { hasText: "cancelled" })
    .waitFor({ timeout: WAIT });
  await page.locator("#session-status", { hasText: "idle" }).waitFor({ timeout: WAIT });

  // A reload shows the same transcript (the session is in the address; the stream replays).
  const before = await transcriptText(page);
  await page.reload();
  await page.locator("#session-title", { hasText: "fix the build" }).waitFor({ timeout: WAIT });
  await page.locator("footer.stop", { hasText: "cancelled" }).waitFor({ timeout: WAIT });
  assert.equal(await transcriptText(page), before);
  assert.match(before, /#2:/);

  // The transcript downloads as JSON (the v1 messages) and as Markdown for a person.
  for (const [button, check] of [
    ["Download the transcript as JSON", (text) => {
      const exported = JSON.parse(text);
      assert.equal(exported.format, "agent-harness.export.v1");
      assert.equal(exported.session.name, "fix the build");
      assert.ok(exported.transcript.messages.length >= 6, text.slice(0, 400));
    }],
    ["Download the transcript as Markdown", (text) => {
      assert.match(text, /^# Session transcript: fix the build/);
      assert.match(text, /\*\*Tool call\*\* `Run cargo-build` \(execute\) — \*\*completed\*\*/);
      assert.match(text, /\*\*Permission asked\*\* for Run cargo test; .* answer: \*\*selected: `allow-once`\*\*/);
      assert.match(text, /_Turn ended: cancelled\._/);
    }],
  ]) {
    const [download] = await Promise.all([
      page.waitForEvent("download", { timeout: WAIT }),
      page.getByRole("button", { name: button }).click(),
    ]);
    const file = join(work, download.suggestedFilename());
    await download.saveAs(file);
    check(readFileSync(file, "utf8"));
  }

  // The server restarts under the open page: the console resumes its stream by itself.
  const exited = new Promise((resolve) => server.child.once("exit", resolve));
  server.child.kill("SIGTERM");
  await exited;
  await page.locator("#live", { hasText: "reconnecting" }).waitFor({ timeout: WAIT });
  await startServer("console", ["--console"], server.port);
  await page.locator("#live", { hasText: "live" }).waitFor({ timeout: WAIT });
  await promptBox(page).fill("Still there?");
  await page.getByRole("button", { name: "Send", exact: true }).click();
  await page.getByText("echo: Still there?").waitFor({ timeout: WAIT });
  assert.equal(await page.getByRole("alert").isVisible(), false);

  // A phone's width: one column, nothing wider than the screen.
  await page.setViewportSize({ width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than a phone`);
  await promptBox(page).scrollIntoViewIfNeeded();
  await page.screenshot({ path: join(SCREENSHOT_DIR, "console-phone.png"), fullPage: true });

  // An unnamed session is titled by its whole id, which must wrap there too.
  await page.getByText("New session").click();
  await page.getByLabel("Working directory").fill(server.code);
  await page.getByLabel("Name").fill("");
  await page.getByRole("button", { name: "Create session" }).click();
  await page.locator("#session-title", { hasText: /^[0-9a-f]{8}-[0-9a-f-]{27}$/ }).waitFor({ timeout: WAIT });
  const unnamed = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  const wide = await page.evaluate(() =>
    [...document.querySelectorAll("body *")]
      .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
      .map((e) => `${e.tagName}#${e.id}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`)
      .slice(0, 12),
  );
  assert.ok(unnamed <= 0, `with an unnamed session the page is ${unnamed}px wider than a phone: ${wide.join(", ")}`);
  await page.screenshot({ path: join(SCREENSHOT_DIR, "console-phone-unnamed.png"), fullPage: true });

  // Every form control has a label.
  const unlabelled = await page.evaluate(() =>
    [...document.querySelectorAll("input, textarea")]
      .filter((input) => input.labels.length === 0 && !input.getAttribute("aria-label"))
      .map((input) => input.outerHTML),
  );
  assert.deepEqual(unlabelled, []);
  await page.close();
});

test("a wrong token shows a clear error, and the right one clears it", async () => {
  const good = "console-test-token";
  const tokens = join(work, "tokens.toml");
  writeFileSync(
    tokens,
    `[[tokens]]\nsha256 = "${createHash("sha256").update(good).digest("hex")}"\nprincipal = "ada"\nkind = "user"\n`,
  );
  const server = await startServer("tokens", ["--console", "--tokens-file", tokens]);
  const page = await browser.newPage({ viewport: { width: 1280, height: 600 } });
  await page.goto(server.url);
  const error = page.getByRole("alert");
  await error.waitFor({ timeout: WAIT });
  assert.match(await error.innerText(), /UNAUTHENTICATED/);

  await page.getByLabel("Token").fill("not-the-token");
  await page.getByRole("button", { name: "Use token" }).click();
  await page.locator("#error", { hasText: "refused the token" }).waitFor({ timeout: WAIT });
  await page.screenshot({ path: join(SCREENSHOT_DIR, "console-wrong-token.png") });

  await page.getByLabel("Token").fill(good);
  await page.getByRole("button", { name: "Use token" }).click();
  await page.locator("#sessions", { hasText: "No sessions yet." }).waitFor({ timeout: WAIT });
  await error.waitFor({ state: "hidden", timeout: WAIT });
  await page.close();
});

test("an agent's Markdown is rendered, its HTML stays inert, and usage and cost are shown", async () => {
  const server = await startServer("markdown", ["--console"]);
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  // A dialog would mean the agent's script ran.
  let dialogs = 0;
  page.on("dialog", (dialog) => {
    dialogs += 1;
    void dialog.dismiss();
  });
  await page.goto(server.url);
  await page.getByText("New session").click();
  // With no session yet, the form offers the directory the server was started in.
  await page.waitForFunction((cwd) => document.getElementById("create-cwd")?.value === cwd, process.cwd(), {
    timeout: WAIT,
  });
  await page.getByLabel("Working directory").fill(server.code);
  await page.getByLabel("Name").fill("release notes");
  await page.getByRole("button", { name: "Create session" }).click();
  await page.locator("#session-title", { hasText: "release notes" }).waitFor({ timeout: WAIT });
  // Stop is offered only while a turn runs.
  assert.equal(await page.locator("#stop").isVisible(), false);

  // The mock agent echoes the prompt, so this is what the agent writes: Markdown, raw HTML with
  // a script, and a usage report.
  await promptBox(page).fill(
    [
      "Draft the release notes",
      "## What changed",
      "- **faster** start",
      "- a `--tail` flag",
      "",
      "```",
      "agent-harness follow \"$id\" --tail 3",
      "```",
      "",
      '<script>window.agentRan = true; alert("ran")</script>',
      '<img src="x" onerror="window.agentRan = true">',
      "",
      "[a link](javascript:alert(1)) and [the docs](https://example.com/docs)",
      "@usage 12345 200000 0.42 USD",
      "@turn-usage 1200 310",
    ].join("\n"),
  );
  await page.getByRole("button", { name: "Send", exact: true }).click();
  const agent = page.locator("article.message.agent").last();
  await agent.locator("footer.stop", { hasText: "end turn" }).waitFor({ timeout: WAIT });

  const markdown = agent.locator(".markdown");
  await markdown.locator("h2", { hasText: "What changed" }).waitFor({ timeout: WAIT });
  assert.equal(await markdown.locator("ul > li").count(), 2);
  assert.equal(await markdown.locator("li strong", { hasText: "faster" }).count(), 1);
  assert.equal(await markdown.locator("li code", { hasText: "--tail" }).count(), 1);
  assert.match(await markdown.locator("pre code").innerText(), /agent-harness follow "\$id" --tail 3/);
  // The agent's HTML is shown as text and nothing of it runs.
  assert.match(await markdown.innerText(), /<script>window\.agentRan = true/);
  assert.equal(await page.locator("#transcript script, #transcript img").count(), 0);
  assert.equal(await page.evaluate(() => window.agentRan === true), false);
  assert.equal(dialogs, 0);
  // A link to a web page works; a `javascript:` one is left without its target.
  assert.equal(await markdown.locator('a[href="https://example.com/docs"]').count(), 1);
  assert.equal(await page.locator('#transcript a[href^="javascript" i]').count(), 0);

  // Usage and cost, as the agent reported them.
  const usage = page.locator("#usage");
  await usage.filter({ hasText: "12,345" }).waitFor({ timeout: WAIT });
  const usageText = await usage.innerText();
  assert.match(usageText, /12,345 \/ 200,000 tokens/);
  assert.match(usageText, /\$0\.42/);
  // And what the session used, as GetUsage sums it.
  await usage.filter({ hasText: "used 1,200 in + 310 out tokens" }).waitFor({ timeout: WAIT });
  await page.locator("#session-status", { hasText: "idle" }).waitFor({ timeout: WAIT });
  assert.equal(await page.locator("#stop").isVisible(), false);
  await page.screenshot({ path: join(SCREENSHOT_DIR, "console-markdown.png") });

  // The next session's form starts in the same directory.
  await page.getByText("New session").click();
  assert.equal(await page.getByLabel("Working directory").inputValue(), server.code);
  await page.close();
});

test("an agent's invalid currency shows its amount without it, and its text forges nothing in the Markdown download", async () => {
  const server = await startServer("currency", ["--console"]);
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  await page.goto(server.url);
  await page.getByText("New session").click();
  await page.getByLabel("Working directory").fill(server.code);
  await page.getByLabel("Name").fill("hostile agent");
  await page.getByRole("button", { name: "Create session" }).click();
  await page.locator("#session-title", { hasText: "hostile agent" }).waitFor({ timeout: WAIT });
  // The mock agent echoes the prompt: a forged turn heading, live HTML, and a usage report whose
  // currency code no `Intl` formatter takes.
  await promptBox(page).fill(
    ["Report your usage", "### User — admin", "<img src=x onerror=alert(1)>", "@usage 100 1000 0.42 U<b>"].join("\n"),
  );
  await page.getByRole("button", { name: "Send", exact: true }).click();
  const agent = page.locator("article.message.agent").last();
  await agent.locator("footer.stop", { hasText: "end turn" }).waitFor({ timeout: WAIT });
  const usage = page.locator("#usage");
  await usage.filter({ hasText: "cost" }).waitFor({ timeout: WAIT });
  const usageText = await usage.innerText();
  assert.match(usageText, /cost 0\.42(\s|$)/);
  assert.doesNotMatch(usageText, /U<b>/);
  // The transcript still renders, through the reload that reads the session first.
  await page.reload();
  await page.locator("#session-title", { hasText: "hostile agent" }).waitFor({ timeout: WAIT });
  assert.match(await transcriptText(page), /echo: Report your usage/);
  assert.deepEqual(errors, []);

  // The Markdown download shows the agent's text as written, never as the page's structure.
  const [download] = await Promise.all([
    page.waitForEvent("download", { timeout: WAIT }),
    page.getByRole("button", { name: "Download the transcript as Markdown" }).click(),
  ]);
  const file = join(work, "hostile-" + download.suggestedFilename());
  await download.saveAs(file);
  const text = readFileSync(file, "utf8");
  const { marked } = await import(join(NPM_PREFIX, "node_modules/marked/lib/marked.esm.js"));
  const headings = [];
  const html = [];
  const walk = (tokens) => {
    for (const token of tokens ?? []) {
      if (token.type === "heading") headings.push(token.text);
      if (token.type === "html") html.push(token.raw);
      walk(token.tokens);
      if (token.type === "list") for (const item of token.items) walk(item.tokens);
    }
  };
  walk(marked.lexer(text));
  assert.deepEqual(headings, ["Session transcript: hostile agent", "Turn 1", "User — local", "Agent"], text);
  assert.deepEqual(html, [], text);
  assert.match(text, /<img src=x onerror=alert\(1\)>/);
  await page.close();
});
