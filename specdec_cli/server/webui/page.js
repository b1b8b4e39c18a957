// specdec's chat page: a conversation with the server's /v1/chat/completions, streamed, with each step's drafts
// shown as the target accepted or rejected them (the stream's `speculation` field, asked with
// `speculative.trace`). Conversations and settings stay in this browser's localStorage, an API key in this tab's
// sessionStorage. Model text is only ever put into the page as text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const PALETTE = ["#b7e4c7", "#ffd6a5", "#bde0fe", "#ffc8dd", "#fdffb6", "#cdb4db", "#a0c4ff", "#e9c46a"];
const MAX_STEPS_KEPT = 4000; // steps of one answer kept for its view (the content is always kept whole)

const store = {
  get(key, fallback) {
    try { const value = JSON.parse(localStorage.getItem("specdec." + key)); return value ?? fallback; }
    catch { return fallback; }
  },
  set(key, value) {
    try { localStorage.setItem("specdec." + key, JSON.stringify(value)); } catch { /* full: kept in memory */ }
  },
};

let conversations = store.get("conversations", []);
let currentId = store.get("current", null);
let running = null; // the AbortController of the answer being streamed
const colours = store.get("colours", {});

// -- elements -----------------------------------------------------------------------------------------------------

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function colourOf(source) {
  if (!(source in colours)) {
    colours[source] = PALETTE[Object.keys(colours).length % PALETTE.length];
    store.set("colours", colours);
    drawLegend();
  }
  return colours[source];
}

function drawLegend() {
  const legend = $("legend");
  legend.replaceChildren();
  for (const [source, colour] of Object.entries(colours)) {
    const item = el("span", "", source);
    item.style.background = colour;
    legend.append(item);
  }
  if (Object.keys(colours).length) legend.append(el("span", "", "target's own tokens: plain"));
}

// -- Markdown, rendered as DOM nodes from text (never innerHTML) ------------------------------------------------

const KEYWORDS = new Set(("def class return if elif else for while in import from as with try except finally raise " +
  "lambda yield pass break continue and or not is None True False function const let var new this async await " +
  "fn pub struct impl enum match mut use mod trait where int char float double void long static public private " +
  "include package func go defer type interface map range switch case default null true false self").split(" "));
const TOKEN = /("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)|(#[^\n]*|\/\/[^\n]*)|(\b\d+(?:\.\d+)?\b)|(\b[A-Za-z_]\w*\b)/g;

function highlight(code, language) {
  const out = document.createDocumentFragment();
  let last = 0;
  const hashComments = !["c", "cpp", "c++", "rust", "go", "js", "javascript", "ts", "typescript", "java"].includes(language);
  for (const match of code.matchAll(TOKEN)) {
    let kind = match[1] ? "string" : match[2] ? "comment" : match[3] ? "number" : KEYWORDS.has(match[4]) ? "keyword" : "";
    if (kind === "comment" && match[2].startsWith("#") && !hashComments) kind = "";
    if (!kind) continue;
    out.append(code.slice(last, match.index), el("span", "tok-" + kind, match[0]));
    last = match.index + match[0].length;
  }
  out.append(code.slice(last));
  return out;
}

function inline(text) {
  const out = document.createDocumentFragment();
  const pattern = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\n]+\*|_[^_\n]+_)/g;
  let last = 0;
  for (const match of text.matchAll(pattern)) {
    out.append(text.slice(last, match.index));
    const inner = match[0].slice(match[2] ? 2 : 1, match[2] ? -2 : -1);
    out.append(el(match[1] ? "code" : match[2] ? "strong" : "em", "", inner));
    last = match.index + match[0].length;
  }
  out.append(text.slice(last));
  return out;
}

function copyButton(text) {
  const button = el("button", "copy", "copy");
  button.type = "button";
  button.addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(text); button.textContent = "copied"; }
    catch { button.textContent = "copy failed"; }
    setTimeout(() => { button.textContent = "copy"; }, 1500);
  });
  return button;
}

function markdown(text) {
  const root = document.createDocumentFragment();
  const lines = text.split("\n");
  let paragraph = [];
  let list = null;
  const flush = () => {
    if (paragraph.length) { const p = el("p"); p.append(inline(paragraph.join("\n"))); root.append(p); }
    paragraph = [];
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+-]*)/);
    if (fence) {
      flush();
      const body = [];
      for (i++; i < lines.length && !/^\s*```/.test(lines[i]); i++) body.push(lines[i]);
      const code = body.join("\n");
      const pre = el("pre");
      const codeNode = el("code");
      codeNode.append(highlight(code, fence[1].toLowerCase()));
      pre.append(copyButton(code), codeNode);
      root.append(pre);
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)/);
    const item = line.match(/^\s*(?:[-*+]|(\d+)[.)])\s+(.*)/);
    if (heading) {
      flush();
      const h = el("h" + Math.min(6, heading[1].length + 2));
      h.append(inline(heading[2]));
      root.append(h);
    } else if (item) {
      if (paragraph.length) { const keep = list; flush(); list = keep; }
      const kind = item[1] ? "ol" : "ul";
      if (!list || list.tagName.toLowerCase() !== kind) { list = el(kind); root.append(list); }
      const li = el("li");
      li.append(inline(item[2]));
      list.append(li);
    } else if (line.startsWith(">")) {
      flush();
      const quote = el("blockquote");
      quote.append(inline(line.replace(/^>\s?/, "")));
      root.append(quote);
    } else if (!line.trim()) {
      flush();
    } else {
      if (list) list = null;
      paragraph.push(line);
    }
  }
  flush();
  return root;
}

// -- one message ----------------------------------------------------------------------------------------------

function traceView(message) {
  // the answer's tokens tinted by the drafter that proposed them, rejected drafts faint where they were cut;
  // cut to the content's length (a stop string may end the content inside the last step's text)
  const view = el("div", "trace");
  let left = message.done ? message.content.length : Infinity;
  const token = ([text, source]) => {
    if (left <= 0) return;
    const shown = text.slice(0, left);
    left -= shown.length;
    const span = el("span", source ? "drafted" : "own", shown);
    if (source) { span.style.background = colourOf(source); span.dataset.source = source; span.title = source; }
    view.append(span);
  };
  for (const step of message.steps || []) {
    // a step: the drafts the target accepted, where the rest of the draft was cut, the target's own token
    const own = step.tokens.length && !step.tokens[step.tokens.length - 1][1] ? step.tokens.slice(-1) : [];
    step.tokens.slice(0, step.tokens.length - own.length).forEach(token);
    for (const rejected of step.rejected || []) if (left > 0) view.append(el("span", "rejected", rejected));
    own.forEach(token);
  }
  if (message.done && left > 0) view.append(el("span", "own", message.content.slice(-left)));
  return view;
}

function sparkline(steps) {
  const counts = steps.filter((step) => step.kind === "step").map((step) => step.tokens.length);
  const width = 160, height = 28, top = Math.max(4, ...counts);
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("class", "plot");
  svg.setAttribute("aria-label", "tokens per step");
  const line = document.createElementNS(svgNS, "polyline");
  const dx = counts.length > 1 ? width / (counts.length - 1) : 0;
  line.setAttribute("points", counts.map((count, i) => `${(i * dx).toFixed(1)},${(height - 2 - (count / top) * (height - 4)).toFixed(1)}`).join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#3a6ea5");
  line.setAttribute("stroke-width", "1.5");
  svg.append(line);
  const title = document.createElementNS(svgNS, "title");
  title.textContent = "tokens per step over the answer";
  svg.append(title);
  return svg;
}

function statsLine(message) {
  const steps = (message.steps || []).filter((step) => step.kind === "step");
  const tokens = (message.steps || []).reduce((sum, step) => sum + step.tokens.length, 0);
  const drafted = steps.reduce((sum, step) => sum + step.drafted, 0);
  const accepted = steps.reduce((sum, step) => sum + step.tokens.filter(([, source]) => source).length, 0);
  const t = message.timings;
  const speed = t ? t.predicted_per_second : message.elapsed ? tokens / message.elapsed : 0;
  const perStep = t ? t.tokens_per_step : steps.length ? (tokens - 1) / steps.length : 0;
  const rate = t ? t.acceptance_rate : drafted ? accepted / drafted : 0;
  const parts = [
    message.drafter || "",
    `${speed.toFixed(1)} tok/s`,
    `${perStep.toFixed(2)} tokens/step`,
    `acceptance ${(100 * rate).toFixed(0)}%`,
    `${t ? t.predicted_n : tokens} tokens`,
  ];
  if (message.ttft_ms !== undefined) parts.push(`first token ${message.ttft_ms.toFixed(0)} ms`);
  return parts.filter(Boolean).join(" · ");
}

function drawMessage(message, node) {
  node = node || el("div");
  node.className = "message " + message.role;
  node.replaceChildren(el("div", "role", message.role === "user" ? "you" : "assistant"));
  const body = el("div", "body");
  if (message.role === "user") body.textContent = message.content;
  else if ($("show-drafts").checked && message.steps && message.steps.length) body.append(traceView(message));
  else body.append(markdown(message.content));
  node.append(body);
  if (message.role === "assistant") {
    const stats = el("div", "stats");
    stats.append(el("span", "figures", statsLine(message)));
    if (message.steps && message.steps.length) stats.append(sparkline(message.steps));
    if (message.finish) stats.append(el("span", "finish", message.finish));
    node.append(stats);
    node.dataset.done = message.done ? "1" : "0";
    if (message.ttft_ms !== undefined) node.dataset.ttftMs = message.ttft_ms.toFixed(1);
  }
  return node;
}

// -- conversations ----------------------------------------------------------------------------------------------

function current() {
  let conversation = conversations.find((c) => c.id === currentId);
  if (!conversation) {
    conversation = { id: String(Date.now()), title: "New chat", messages: [] };
    conversations.unshift(conversation);
    currentId = conversation.id;
  }
  return conversation;
}

function save() {
  store.set("conversations", conversations);
  store.set("current", currentId);
}

function drawConversations() {
  const list = $("conversations");
  list.replaceChildren();
  for (const conversation of conversations) {
    const item = el("li", conversation.id === currentId ? "current" : "", conversation.title);
    item.addEventListener("click", () => { if (!running) { currentId = conversation.id; save(); drawAll(); } });
    list.append(item);
  }
}

function drawAll() {
  const box = $("messages");
  box.replaceChildren(...current().messages.map((message) => drawMessage(message)));
  box.classList.toggle("hide-rejected", !$("show-rejected").checked);
  drawConversations();
  box.scrollTop = box.scrollHeight;
}

// -- the API ----------------------------------------------------------------------------------------------------

function headers() {
  const key = sessionStorage.getItem("specdec.key");
  return { "Content-Type": "application/json", ...(key ? { Authorization: "Bearer " + key } : {}) };
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

async function refused(response) {
  let message = `the server answered ${response.status}`;
  try { message = (await response.json()).error.message || message; } catch { /* not JSON */ }
  if (response.status === 401) $("key-form").hidden = false;
  return new Error(message);
}

function requestBody(messages) {
  const body = { model: $("model").textContent, messages, stream: true, stream_options: { include_usage: true },
                 speculative: { trace: true } };
  const system = $("system").value.trim();
  if (system) body.messages = [{ role: "system", content: system }, ...messages];
  if ($("drafter").value) body.speculative.drafter = $("drafter").value;
  for (const name of ["temperature", "top_p", "max_tokens", "seed"]) {
    const value = $(name).value.trim();
    if (value !== "") body[name] = Number(value);
  }
  return body;
}

async function answer() {
  const conversation = current();
  const asked = conversation.messages.map(({ role, content }) => ({ role, content }));
  const message = { role: "assistant", content: "", steps: [], drafter: $("drafter").value === "none" ? "plain" : "",
                    asked_at: performance.timeOrigin + performance.now() };
  conversation.messages.push(message);
  const box = $("messages");
  const node = drawMessage(message);
  box.append(node);
  running = new AbortController();
  $("stop").disabled = false;
  $("send").disabled = true;
  showError("");
  const started = performance.now();
  let drawn = 0;
  const redraw = (force) => {
    const now = performance.now();
    if (!force && now - drawn < 50) return;
    drawn = now;
    message.elapsed = (now - started) / 1000;
    drawMessage(message, node);
    box.scrollTop = box.scrollHeight;
  };
  try {
    const response = await fetch("/v1/chat/completions", { method: "POST", headers: headers(),
      body: JSON.stringify(requestBody(asked)), signal: running.signal });
    if (!response.ok) throw await refused(response);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const chunk = JSON.parse(event.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.speculation) {
          if (message.ttft_ms === undefined && chunk.speculation.tokens.length) message.ttft_ms = performance.now() - started;
          if (message.steps.length < MAX_STEPS_KEPT) message.steps.push(chunk.speculation);
        }
        const choice = chunk.choices && chunk.choices[0];
        if (choice && choice.delta && choice.delta.content) message.content += choice.delta.content;
        if (choice && choice.finish_reason) message.finish = choice.finish_reason;
        if (chunk.timings) { message.timings = chunk.timings; message.drafter = chunk.timings.n_max === 0 ? "plain" : chunk.timings.drafter; }
      }
      redraw(false);
    }
  } catch (error) {
    if (error.name !== "AbortError") showError(error.message);
    else message.finish = "stopped";
  } finally {
    message.done = true;
    running = null;
    $("stop").disabled = true;
    $("send").disabled = false;
    redraw(true);
    save();
  }
}

// -- wiring -----------------------------------------------------------------------------------------------------

function send(event) {
  event.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || running) return;
  const conversation = current();
  if (!conversation.messages.length) conversation.title = text.trim().slice(0, 40);
  conversation.messages.push({ role: "user", content: text });
  $("prompt").value = "";
  drawAll();
  answer();
}

function regenerate() {
  const conversation = current();
  if (running || !conversation.messages.length) return;
  if (conversation.messages[conversation.messages.length - 1].role === "assistant") conversation.messages.pop();
  if (!conversation.messages.length) return;
  drawAll();
  answer();
}

function keepSettings() {
  const settings = {};
  for (const name of ["system", "temperature", "top_p", "max_tokens", "seed", "drafter"]) settings[name] = $(name).value;
  settings.showDrafts = $("show-drafts").checked;
  settings.showRejected = $("show-rejected").checked;
  store.set("settings", settings);
}

async function start() {
  const settings = store.get("settings", {});
  for (const name of ["system", "temperature", "top_p", "max_tokens", "seed"]) $(name).value = settings[name] || "";
  if (settings.showDrafts === false) $("show-drafts").checked = false;
  if (settings.showRejected === false) $("show-rejected").checked = false;
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (event) => { if (event.key === "Enter" && !event.shiftKey) send(event); });
  $("stop").addEventListener("click", () => running && running.abort());
  $("regenerate").addEventListener("click", regenerate);
  $("new-chat").addEventListener("click", () => { if (!running) { currentId = null; current(); save(); drawAll(); } });
  for (const name of ["system", "temperature", "top_p", "max_tokens", "seed", "drafter"]) $(name).addEventListener("change", keepSettings);
  for (const name of ["show-drafts", "show-rejected"]) $(name).addEventListener("change", () => { keepSettings(); drawAll(); });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("specdec.key", $("key").value);
    $("key-form").hidden = true;
    showError("");
    loadModel();
  });
  drawLegend();
  drawAll();
  await loadModel();
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) throw await refused(response);
    const model = (await response.json()).data[0].id;
    $("model").textContent = model;
    const props = await fetch("/props", { headers: headers() }).then((r) => (r.ok ? r.json() : {}));
    const types = ((props.default_generation_settings || {}).params || {})["speculative.types"] || "";
    if (types.startsWith("specdec:")) $("drafter").options[0].textContent = types.slice("specdec:".length);
    else if (types === "none") $("drafter").options[0].textContent = "none (the server drafts nothing)";
    const settings = store.get("settings", {});
    if (settings.drafter !== undefined) $("drafter").value = settings.drafter;
  } catch (error) {
    showError(error.message);
  }
}

start();
