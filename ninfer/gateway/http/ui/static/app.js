// The playground page: conversations, the composer, the settings panel, and one streamed
// answer at a time (the message DOM is views.js; model text reaches the DOM only as text nodes).
//
// Streaming: each SSE chunk only appends to the message record and schedules one render per
// animation frame; a render appends the new reasoning text as a text node and re-renders only
// the open Markdown segment of the answer (MarkdownView), so the cost per frame does not grow
// with the answer's length.

import { APIError, call, health, setApiKey, streamChat } from './client.js';
import * as store from './store.js';
import { assistantView, button, el, userView } from './views.js';

const $ = (id) => document.getElementById(id);
const HEALTH_POLL_MS = 500;
const MIN_RATE_MS = 50;

const ui = {
  messages: $('messages'), input: $('input'), send: $('send'), stop: $('stop'), form: $('composer'),
  attachments: $('attachments'), fileInput: $('file-input'), status: $('banner-status'), demo: $('banner-demo'),
  list: $('conversations'), modelName: $('model-name'), context: $('context-count'),
};
const fields = {
  system: $('system-prompt'), temperature: $('temperature'), top_p: $('top-p'), top_k: $('top-k'),
  max_tokens: $('max-tokens'), thinking: $('thinking'), thinking_budget: $('thinking-budget'), tools: $('tools'),
};

let saved = store.loadConversations();          // {list: [conversation], current: id}
let conv = saved.list.find((c) => c.id === saved.current) || newConversation();
let model = null;
let maxModelLen = null;
let ready = false;
let polling = null;
let active = null;                               // the answer being streamed: {controller, msg}
let attachments = [];                            // data: URLs of the draft's images

function newConversation() {
  const id = globalThis.crypto?.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
  return { id, title: '', created: Date.now(), messages: [] };
}

// ---- status banners, server readiness, model, API key ------------------------------------
function showStatus(text) {
  ui.status.textContent = text;
  ui.status.hidden = !text;
}

function updateControls() {
  ui.send.disabled = !ready || active !== null;
  ui.send.hidden = active !== null;
  ui.stop.hidden = active === null;
  ui.send.title = ready ? '' : 'waiting for the server';
}

function waitReady() {
  if (polling) return polling;
  ready = false;
  updateControls();
  polling = (async () => {
    for (;;) {
      const h = await health();
      if (h.ready) break;
      const why = h.reason ? ` (${h.reason})` : '';
      showStatus(h.status === 'unreachable' ? 'Cannot reach the server; retrying…'
        : `The server is ${h.status}${why}; waiting until it is ready…`);
      await new Promise((r) => setTimeout(r, HEALTH_POLL_MS));
    }
    showStatus('');
    ready = true;
    polling = null;
    updateControls();
    await loadModel();
  })();
  return polling;
}

async function loadModel() {
  try {
    const card = (await withKey(() => call('/v1/models'))).data[0];
    model = card.id;
    maxModelLen = card.max_model_len ?? null;
    ui.modelName.textContent = model;
    if (card.synthetic_weights && !card.demo) {
      ui.demo.textContent = 'Synthetic weights (--load-format dummy, a benchmarking aid): the text is meaningless.';
    }
    ui.demo.hidden = !(card.demo || card.synthetic_weights);
    countTokens();
  } catch (e) {
    showStatus(`Cannot read the model list: ${e.message}`);
  }
}

let keyRequest = null;
function askKey() {
  if (keyRequest) return keyRequest;
  keyRequest = new Promise((resolve) => {
    const dialog = $('key-dialog');
    const form = $('key-form');
    const input = $('key-input');
    dialog.hidden = false;
    input.value = '';
    input.focus();
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const key = input.value.trim();
      setApiKey(key);
      store.saveKey(key);
      dialog.hidden = true;
      keyRequest = null;
      resolve();
    }, { once: true });
  });
  return keyRequest;
}

/** Run `fn`; on 401 ask for the API key and run it again. */
async function withKey(fn) {
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      if (!(e instanceof APIError && e.status === 401)) throw e;
      await askKey();
    }
  }
}

// ---- settings -------------------------------------------------------------------------------
function loadSettings() {
  const s = store.loadSettings();
  for (const [name, input] of Object.entries(fields)) {
    if (!(name in s)) continue;
    if (input.type === 'checkbox') input.checked = Boolean(s[name]);
    else input.value = s[name];
  }
}

function saveSettings() {
  const s = {};
  for (const [name, input] of Object.entries(fields)) s[name] = input.type === 'checkbox' ? input.checked : input.value;
  store.saveSettings(s);
}

function number(input) {
  return input.value.trim() === '' ? undefined : Number(input.value);
}

/** The sampling fields of a request; throws Error naming the field at fault. */
function requestParams() {
  const p = {
    temperature: number(fields.temperature), top_p: number(fields.top_p), top_k: number(fields.top_k),
    max_tokens: number(fields.max_tokens),
    chat_template_kwargs: { enable_thinking: fields.thinking.checked },
  };
  if (fields.thinking.checked) p.thinking_budget = number(fields.thinking_budget);
  const tools = fields.tools.value.trim();
  $('tools-error').hidden = true;
  if (tools) {
    let parsed;
    try {
      parsed = JSON.parse(tools);
    } catch (e) {
      throw new Error(`Tools: not valid JSON (${e.message})`);
    }
    if (!Array.isArray(parsed)) throw new Error('Tools: give a JSON array of tool definitions');
    p.tools = parsed;
  }
  for (const k of Object.keys(p)) if (p[k] === undefined) delete p[k];
  return p;
}

// ---- conversations --------------------------------------------------------------------------
function persist() {
  if (conv.messages.length && !saved.list.includes(conv)) saved.list.unshift(conv);
  saved.current = conv.id;
  conv.updated = Date.now();
  if (!store.saveConversations(saved)) showStatus('Local storage is full: images of this conversation were not kept.');
  renderSidebar();
}

function renderSidebar() {
  const items = [...saved.list].sort((a, b) => (b.updated || b.created) - (a.updated || a.created)).map((c) => {
    const li = el('li', c.id === conv.id ? 'current' : '');
    li.append(button(c.title || 'New chat', 'open', () => switchTo(c)),
      button('×', 'delete', () => removeConversation(c)));
    li.lastChild.title = 'delete this conversation';
    return li;
  });
  ui.list.replaceChildren(...items);
}

function switchTo(c) {
  if (active) active.controller.abort();
  conv = c;
  saved.current = c.id;
  store.saveConversations(saved);
  renderSidebar();
  renderConversation();
  countTokens();
}

function removeConversation(c) {
  saved.list = saved.list.filter((x) => x !== c);
  if (c === conv) {
    if (active) active.controller.abort();
    conv = saved.list[0] || newConversation();
    renderConversation();
  }
  saved.current = conv.id;
  store.saveConversations(saved);
  renderSidebar();
}

// ---- messages -------------------------------------------------------------------------------
function historyMessages(messages, withImages = true) {
  const out = [];
  const system = fields.system.value.trim();
  if (system) out.push({ role: 'system', content: system });
  for (const m of messages) {
    if (m.role === 'user') {
      const images = withImages ? (m.images || []).filter(Boolean) : [];
      if (!images.length) { out.push({ role: 'user', content: m.text }); continue; }
      const parts = m.text ? [{ type: 'text', text: m.text }] : [];
      for (const url of images) parts.push({ type: 'image_url', image_url: { url } });
      out.push({ role: 'user', content: parts });
    } else if (m.content || m.tool_calls?.length) {
      const a = { role: 'assistant', content: m.content };
      if (m.tool_calls?.length) {
        a.tool_calls = m.tool_calls.map((c, i) => ({
          id: c.id || `call_${i}`, type: 'function', function: { name: c.name, arguments: c.arguments || '{}' },
        }));
      }
      out.push(a);
    }
  }
  return out;
}

function editMessage(article, msg, index) {
  if (active) return;
  const box = el('textarea', 'edit-box');
  box.value = msg.text;
  box.rows = Math.min(12, Math.max(2, msg.text.split('\n').length));
  const actions = el('div', 'actions');
  actions.append(button('Save & send', 'save-edit', () => {
    if (active) return;
    msg.text = box.value;
    conv.messages.length = index + 1;
    persist();
    renderConversation();
    generate();
  }), button('Cancel', 'cancel-edit', () => renderConversation()));
  article.replaceChildren(box, actions);
  box.focus();
}

function mergeToolCalls(calls, deltas) {
  for (const d of deltas) {
    const c = calls[d.index] || (calls[d.index] = { id: '', name: '', arguments: '' });
    if (d.id) c.id = d.id;
    if (d.function?.name) c.name += d.function.name;
    if (d.function?.arguments) c.arguments += d.function.arguments;
  }
}

function editable(index) {
  return (article) => editMessage(article, conv.messages[index], index);
}

function renderConversation() {
  const n = conv.messages.length;
  const idle = active === null;
  const lastUser = conv.messages.at(-1)?.role === 'user' ? n - 1 : n - 2;
  const nodes = conv.messages.map((m, i) => (m.role === 'user'
    ? userView(m, i, idle && i === lastUser ? editable(i) : null)
    : assistantView(m, i, ui.messages, idle && i === n - 1 ? regenerate : null).article));
  if (!n) nodes.push(el('p', 'empty', 'Send a message to start.'));
  ui.messages.replaceChildren(...nodes);
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

// ---- sending and streaming ------------------------------------------------------------------
async function send() {
  if (active || !ready) return;
  const text = ui.input.value.trim();
  if (!text && !attachments.length) return;
  try {
    requestParams();
  } catch (e) {
    $('tools-error').textContent = e.message;
    $('tools-error').hidden = false;
    return;
  }
  conv.messages.push({ role: 'user', text, images: attachments });
  if (!conv.title) conv.title = text.slice(0, 48) || 'Image';
  ui.input.value = '';
  attachments = [];
  renderAttachments();
  persist();
  renderConversation();
  await generate();
}

function regenerate() {
  if (active) return;
  const last = conv.messages.at(-1);
  if (last?.role === 'assistant') conv.messages.pop();
  renderConversation();
  generate();
}

async function generate() {
  let params;
  try {
    params = requestParams();
  } catch (e) {
    $('tools-error').textContent = e.message;
    $('tools-error').hidden = false;
    return;
  }
  const body = {
    model: model || undefined, messages: historyMessages(conv.messages), stream: true,
    stream_options: { include_usage: true }, ...params,
  };
  const msg = { role: 'assistant', content: '', reasoning: '', tool_calls: [], stats: null, finish: null, error: null };
  const controller = new AbortController();
  active = { controller, msg };
  updateControls();
  conv.messages.push(msg);
  renderConversation();
  const view = assistantView(msg, conv.messages.length - 1, ui.messages, null);
  ui.messages.lastChild.replaceWith(view.article);
  view.streaming(true);
  const t0 = performance.now();
  let tFirst = null;
  let chunks = 0;
  let usage = null;
  const onChunk = (obj) => {
    if (obj.usage) usage = obj.usage;
    for (const ch of obj.choices || []) {
      const d = ch.delta || {};
      const reasoning = d.reasoning_content || d.reasoning;
      if (d.content || reasoning || d.tool_calls) {
        if (tFirst === null) tFirst = performance.now();
        chunks++;
      }
      if (reasoning) msg.reasoning += reasoning;
      if (d.content) msg.content += d.content;
      if (d.tool_calls) mergeToolCalls(msg.tool_calls, d.tool_calls);
      if (ch.finish_reason) msg.finish = ch.finish_reason;
    }
    view.schedule();
  };
  try {
    await withKey(() => streamChat(body, controller.signal, onChunk));
  } catch (e) {
    if (e.name === 'AbortError') msg.finish = 'stopped';
    else {
      msg.error = e.message;
      if (e instanceof APIError && e.status === 503) waitReady();
    }
  }
  const tEnd = performance.now();
  const tokens = usage ? usage.completion_tokens : chunks;
  // NOTE: a rate over less than MIN_RATE_MS (a whole answer in one network read) means nothing
  const rated = tFirst !== null && tokens > 1 && tEnd - tFirst >= MIN_RATE_MS;
  msg.stats = tFirst === null && !usage ? null : {
    ttft_ms: tFirst === null ? null : tFirst - t0,
    tokens_per_s: rated ? (tokens - 1) / ((tEnd - tFirst) / 1000) : null,
    completion_tokens: tokens, approximate: !usage,
    prompt_tokens: usage?.prompt_tokens ?? null,
    reasoning_tokens: usage?.completion_tokens_details?.reasoning_tokens ?? null,
    cached_tokens: usage?.prompt_tokens_details?.cached_tokens ?? null,
  };
  if (!msg.error && !msg.content && !msg.reasoning && !msg.tool_calls.length && msg.finish !== 'stopped') {
    msg.error = 'The model returned an empty answer.';
  }
  active = null;
  view.render();
  view.streaming(false);
  updateControls();
  persist();
  // the actions of the last turn (Edit, Regenerate) come back; the answer is not rendered again
  const at = conv.messages.indexOf(msg);
  if (at === conv.messages.length - 1 && view.article.isConnected) {
    view.setActions(regenerate);
    const prev = view.article.previousElementSibling;
    if (prev && conv.messages[at - 1]?.role === 'user') {
      prev.replaceWith(userView(conv.messages[at - 1], at - 1, editable(at - 1)));
    }
  }
  countTokens();
}

// ---- draft: attachments, token count --------------------------------------------------------
function renderAttachments() {
  ui.attachments.replaceChildren(...attachments.map((url, i) => {
    const box = el('span', 'attachment');
    const img = el('img');
    img.src = url;
    img.alt = 'image to send';
    box.append(img, button('×', 'remove', () => { attachments.splice(i, 1); renderAttachments(); }));
    return box;
  }));
}

function addFiles(files) {
  for (const f of files) {
    if (!f.type.startsWith('image/')) continue;
    const reader = new FileReader();
    reader.onload = () => { attachments.push(reader.result); renderAttachments(); };
    reader.readAsDataURL(f);
  }
}

let countTimer = null;
function countTokens() {
  clearTimeout(countTimer);
  countTimer = setTimeout(async () => {
    if (!ready || active) return;
    const draft = ui.input.value.trim();
    const messages = historyMessages(conv.messages, false);
    if (draft) messages.push({ role: 'user', content: draft });
    if (!messages.length) { ui.context.textContent = ''; return; }
    try {
      const r = await call('/tokenize', {
        messages, add_generation_prompt: true, chat_template_kwargs: { enable_thinking: fields.thinking.checked },
      });
      ui.context.textContent = `${r.count} / ${r.max_model_len ?? maxModelLen} tokens`;
    } catch {
      ui.context.textContent = '';
    }
  }, 400);
}

// ---- wiring -------------------------------------------------------------------------------
function wire() {
  ui.form.addEventListener('submit', (ev) => { ev.preventDefault(); send(); });
  ui.input.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); }
  });
  ui.input.addEventListener('input', countTokens);
  ui.stop.addEventListener('click', () => active?.controller.abort());
  $('new-chat').addEventListener('click', () => {
    if (active) active.controller.abort();
    conv = newConversation();
    renderSidebar();
    renderConversation();
    ui.input.focus();
  });
  $('attach').addEventListener('click', () => ui.fileInput.click());
  ui.fileInput.addEventListener('change', () => { addFiles(ui.fileInput.files); ui.fileInput.value = ''; });
  const chat = $('chat');
  chat.addEventListener('dragover', (ev) => {
    if ([...ev.dataTransfer.types].includes('Files')) { ev.preventDefault(); chat.classList.add('dropping'); }
  });
  chat.addEventListener('dragleave', () => chat.classList.remove('dropping'));
  chat.addEventListener('drop', (ev) => {
    chat.classList.remove('dropping');
    if (ev.dataTransfer.files.length) { ev.preventDefault(); addFiles(ev.dataTransfer.files); }
  });
  document.addEventListener('paste', (ev) => {
    const files = [...(ev.clipboardData?.files || [])].filter((f) => f.type.startsWith('image/'));
    if (files.length) { ev.preventDefault(); addFiles(files); }
  });
  for (const input of Object.values(fields)) input.addEventListener('change', saveSettings);
  fields.thinking.addEventListener('change', countTokens);
  fields.system.addEventListener('change', countTokens);
  $('toggle-settings').addEventListener('click', (ev) => {
    const hidden = document.body.classList.toggle('settings-hidden');
    ev.currentTarget.setAttribute('aria-expanded', String(!hidden));
  });
  $('forget-key').addEventListener('click', () => { store.saveKey(null); setApiKey(null); });
  ui.messages.addEventListener('click', (ev) => {
    const b = ev.target.closest('button.copy');
    if (!b) return;
    const code = b.closest('.code')?.querySelector('pre')?.textContent ?? '';
    navigator.clipboard?.writeText(code).then(() => { b.textContent = 'Copied'; }, () => {});
  });
}

setApiKey(store.loadKey());
loadSettings();
wire();
renderSidebar();
renderConversation();
updateControls();
waitReady();
