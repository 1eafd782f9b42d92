// The DOM of the conversation's messages. Model text reaches the DOM only as text nodes: the
// answer through markdown.js, reasoning, tool calls and errors through textContent.

import { MarkdownView } from './markdown.js';

export function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

export function button(text, className, onClick) {
  const b = el('button', className, text);
  b.type = 'button';
  b.addEventListener('click', onClick);
  return b;
}

/** A user message; `onEdit(article)` given: with an Edit button. */
export function userView(msg, index, onEdit) {
  const article = el('article', 'msg user');
  article.dataset.index = index;
  const body = el('div', 'body', msg.text);
  article.append(body);
  if (msg.images?.length) {
    const row = el('div', 'images');
    for (const url of msg.images) {
      if (!url) { row.append(el('span', 'image-missing', '[image not kept]')); continue; }
      const img = el('img');
      img.src = url;
      img.alt = 'attached image';
      row.append(img);
    }
    article.append(row);
  }
  if (onEdit) {
    const actions = el('div', 'actions');
    actions.append(button('Edit', 'edit', () => onEdit(article)));
    article.append(actions);
  }
  return article;
}

function statsText(s, finish) {
  const parts = [];
  if (s.ttft_ms != null) parts.push(`TTFT ${Math.round(s.ttft_ms)} ms`);
  if (s.tokens_per_s != null) parts.push(`${s.tokens_per_s.toFixed(1)} tok/s`);
  const count = `${s.approximate ? '~' : ''}${s.completion_tokens} tokens`;
  parts.push(s.prompt_tokens != null ? `${s.prompt_tokens} prompt + ${count}` : count);
  if (s.reasoning_tokens) parts.push(`${s.reasoning_tokens} reasoning`);
  if (s.cached_tokens) parts.push(`${s.cached_tokens} cached`);
  if (finish) parts.push(finish === 'stopped' ? 'stopped' : `finish: ${finish}`);
  return parts.join(' · ');
}

export function toolCallNodes(calls) {
  return calls.filter(Boolean).map((c) => {
    const box = el('div', 'tool-call');
    const head = el('div', 'tool-head');
    head.append(el('span', 'tool-kind', 'tool call'), el('span', 'tool-name', c.name || '…'));
    if (c.id) head.append(el('span', 'tool-id', c.id));
    let args = c.arguments;
    try { args = JSON.stringify(JSON.parse(c.arguments), null, 2); } catch { /* partial or not JSON: as sent */ }
    const pre = el('pre', 'tool-args');
    pre.append(el('code', '', args));
    box.append(head, pre);
    return box;
  });
}

/**
 * An assistant message and its renderer: render() shows what `msg` holds now (new reasoning text
 * appended as a text node, the answer's open Markdown segment re-rendered), schedule() renders at
 * the next animation frame (once however many chunks arrive before it). `scroller` follows the
 * text while it is scrolled to the bottom; setActions(onRegenerate or null).
 */
export function assistantView(msg, index, scroller, onRegenerate) {
  const article = el('article', 'msg assistant');
  article.dataset.index = index;
  const reasoning = el('details', 'reasoning');
  reasoning.append(el('summary', '', 'Reasoning'));
  const reasoningBody = el('div', 'reasoning-body');
  reasoning.append(reasoningBody);
  reasoning.hidden = true;
  const answer = el('div', 'answer md');
  const tools = el('div', 'tool-calls');
  const error = el('div', 'error');
  error.hidden = true;
  const footer = el('footer', 'stats');
  const actions = el('div', 'actions');
  article.append(reasoning, answer, tools, error, footer, actions);
  const markdown = new MarkdownView(answer);
  let reasoningShown = 0;
  let toolsShown = '';
  let pending = false;

  function render() {
    pending = false;
    const stick = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80;
    if (msg.reasoning.length > reasoningShown) {
      reasoning.hidden = false;
      reasoningBody.append(msg.reasoning.slice(reasoningShown));
      reasoningShown = msg.reasoning.length;
    }
    markdown.update(msg.content);
    const toolsNow = JSON.stringify(msg.tool_calls);
    if (toolsNow !== toolsShown) {
      tools.replaceChildren(...toolCallNodes(msg.tool_calls));
      toolsShown = toolsNow;
    }
    error.hidden = !msg.error;
    error.textContent = msg.error || '';
    footer.textContent = msg.stats ? statsText(msg.stats, msg.finish) : '';
    if (stick) scroller.scrollTop = scroller.scrollHeight;
  }

  function setActions(onClick) {
    actions.replaceChildren();
    if (onClick) actions.append(button('Regenerate', 'regenerate', onClick));
  }

  render();
  setActions(onRegenerate);
  return {
    article, setActions, render,
    schedule() {
      if (!pending) { pending = true; requestAnimationFrame(render); }
    },
    streaming(on) { reasoning.open = on; article.classList.toggle('streaming', on); },
  };
}
