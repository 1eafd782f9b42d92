// A small Markdown renderer that builds DOM nodes. Model text is untrusted: it never reaches
// innerHTML; every piece of it becomes a text node (raw HTML in the text shows as text).
//
// Supported: ATX headings, paragraphs (line breaks kept), bullet and ordered lists (nested by
// indentation), block quotes, fenced code blocks, thematic breaks, pipe tables, and inline code,
// **strong**, *emphasis*, ~~strike~~, backslash escapes, [links](https://...) and bare http(s)
// URLs. Links become anchors only for http(s) and mailto URLs; any other link stays text.
//
// Streaming: the text is cut into segments at a blank line (outside a code fence) followed by a
// line that starts at column 0. Each segment is rendered on its own, so a finished segment never
// changes; MarkdownView renders a finished segment once and re-renders only the last, open one.
// A whole-text render (renderMarkdown) goes through the same cuts, so it gives the same DOM.

const FENCE_OPEN = /^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)/;
const FENCE_CLOSE = /^ {0,3}(`{3,}|~{3,})[ \t]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const HR = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const LIST = /^( {0,3})([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const TABLE_SEP = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
const INLINE = new RegExp([
  /\\([\\`*_{}[\]()#+\-.!~|>])/.source,                               // 1 escape
  /(`+)([^`]|[^`][\s\S]*?[^`])\2(?!`)/.source,                        // 2, 3 code span
  /\[([^\]\n]+)\]\(\s*<?([^\s()<>]+)>?(?:\s+"[^"\n]*")?\s*\)/.source,  // 4, 5 link
  /\*\*(?=\S)([\s\S]*?\S)\*\*/.source,                                 // 6 strong
  /(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)/.source,                        // 7 strong
  /~~(?=\S)([\s\S]*?\S)~~/.source,                                     // 8 strike
  /\*(?=[^\s*])([\s\S]*?[^\s*])\*(?!\*)/.source,                       // 9 emphasis
  /(?<!\w)_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/.source,                  // 10 emphasis
  /(https?:\/\/[^\s<>()"'`]*[^\s<>()"'`.,;:!?*_~])/.source,            // 11 bare URL
].join('|'), 'g');

function el(tag, className) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  return e;
}

function expandTabs(line) {
  return line.replace(/^[ \t]+/, (ws) => ws.replace(/\t/g, '    ')).replace(/\r$/, '');
}

function indentOf(line) {
  return line.length - line.trimStart().length;
}

function closesFence(line, fence) {
  const m = FENCE_CLOSE.exec(line);
  return m !== null && m[1][0] === fence[0] && m[1].length >= fence.length;
}

/** A safe href for `url`: absolute http(s) or mailto only; null otherwise. */
export function safeHref(url) {
  if (!/^(https?:\/\/|mailto:)/i.test(url)) return null;
  try {
    const u = new URL(url);
    return ['http:', 'https:', 'mailto:'].includes(u.protocol) ? u.href : null;
  } catch {
    return null;
  }
}

function anchor(href, text, inLink) {
  const a = el('a');
  a.href = href;
  a.target = '_blank';
  a.rel = 'noopener noreferrer nofollow';
  inline(text, a, true);
  return a;
}

/** Append the inline rendering of `text` to `parent` (text nodes and formatting elements only). */
export function inline(text, parent, inLink = false) {
  let last = 0;
  INLINE.lastIndex = 0;
  const matches = [];
  for (let m; (m = INLINE.exec(text)) !== null;) matches.push(m);
  for (const m of matches) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    last = m.index + m[0].length;
    let node;
    if (m[1] !== undefined) node = document.createTextNode(m[1]);
    else if (m[3] !== undefined) {
      node = el('code');
      node.textContent = m[3].length > 2 && m[3][0] === ' ' && m[3].at(-1) === ' ' ? m[3].slice(1, -1) : m[3];
    } else if (m[4] !== undefined) {
      const href = inLink ? null : safeHref(m[5]);
      if (href) node = anchor(href, m[4]);
      else { node = el('span'); inline(m[4], node, inLink); node.append(` (${m[5]})`); }
    } else if (m[6] !== undefined || m[7] !== undefined) {
      node = el('strong'); inline(m[6] ?? m[7], node, inLink);
    } else if (m[8] !== undefined) {
      node = el('del'); inline(m[8], node, inLink);
    } else if (m[9] !== undefined || m[10] !== undefined) {
      node = el('em'); inline(m[9] ?? m[10], node, inLink);
    } else {
      const href = inLink ? null : safeHref(m[11]);
      node = href ? anchor(href, m[11]) : document.createTextNode(m[11]);
    }
    parent.append(node);
  }
  if (last < text.length) parent.append(text.slice(last));
}

function codeBlock(code, lang) {
  const box = el('div', 'code');
  const head = el('div', 'code-head');
  const label = el('span', 'code-lang');
  label.textContent = lang || 'code';
  const copy = el('button', 'copy');
  copy.type = 'button';
  copy.textContent = 'Copy';
  head.append(label, copy);
  const pre = el('pre');
  const c = el('code');
  c.textContent = code;
  pre.append(c);
  box.append(head, pre);
  return box;
}

function startsBlock(line) {
  return FENCE_OPEN.test(line) || HEADING.test(line) || HR.test(line) || QUOTE.test(line) || LIST.test(line);
}

function splitRow(line) {
  let s = line.trim();
  if (s.startsWith('|')) s = s.slice(1);
  if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => c.trim());
}

function table(lines, i, out) {
  const head = splitRow(lines[i]);
  const aligns = splitRow(lines[i + 1]).map((c) =>
    c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : c.startsWith(':') ? 'left' : '');
  const t = el('table');
  const row = (cells, tag) => {
    const tr = el('tr');
    head.forEach((_, k) => {
      const td = el(tag);
      if (aligns[k]) td.className = `align-${aligns[k]}`;
      inline(cells[k] ?? '', td);
      tr.append(td);
    });
    return tr;
  };
  const thead = el('thead');
  thead.append(row(head, 'th'));
  const tbody = el('tbody');
  i += 2;
  while (i < lines.length && lines[i].trim() && lines[i].includes('|')) tbody.append(row(splitRow(lines[i++]), 'td'));
  t.append(thead, tbody);
  const wrap = el('div', 'table');
  wrap.append(t);
  out.append(wrap);
  return i;
}

function list(lines, i, out) {
  const first = LIST.exec(lines[i]);
  const ordered = /\d/.test(first[2]);
  const node = el(ordered ? 'ol' : 'ul');
  const start = parseInt(first[2], 10);
  if (ordered && start !== 1) node.start = start;
  while (i < lines.length) {
    const m = LIST.exec(lines[i]);
    if (!m || /\d/.test(m[2]) !== ordered || HR.test(lines[i])) break;
    const width = m[1].length + m[2].length + Math.min((m[3] || ' ').length, 4);
    const item = [m[4] ?? ''];
    i++;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) {
        let j = i + 1;
        while (j < lines.length && !lines[j].trim()) j++;
        if (j < lines.length && (indentOf(lines[j]) >= width || LIST.test(lines[j]))) {
          if (indentOf(lines[j]) < width) { i = j; break; }        // the next item of this list
          for (; i < j; i++) item.push('');
          continue;
        }
        break;
      }
      if (indentOf(line) >= width) { item.push(line.slice(width)); i++; continue; }
      if (startsBlock(line)) break;
      item.push(line.trimStart());                                  // lazy continuation
      i++;
    }
    const li = el('li');
    blocks(item, li);
    const lead = li.firstChild;
    if (lead && lead.nodeName === 'P' && !item.includes('')) lead.replaceWith(...lead.childNodes);   // tight item
    node.append(li);
    if (i < lines.length && !lines[i].trim()) break;
  }
  out.append(node);
  return i;
}

/** Append the block rendering of `lines` (tab-expanded, no \r) to `out`. */
function blocks(lines, out) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }
    let m;
    if ((m = FENCE_OPEN.exec(line))) {
      const fence = m[1];
      const indent = indentOf(line);
      const body = [];
      i++;
      while (i < lines.length && !closesFence(lines[i], fence)) {
        const l = lines[i++];
        body.push(l.slice(Math.min(indent, indentOf(l))));
      }
      i++;
      out.append(codeBlock(body.join('\n'), m[2]));
    } else if ((m = HEADING.exec(line))) {
      const h = el(`h${m[1].length}`);
      inline(m[2] || '', h);
      out.append(h);
      i++;
    } else if (HR.test(line)) {
      out.append(el('hr'));
      i++;
    } else if (QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && lines[i].trim()) {
        const q = QUOTE.exec(lines[i]);
        if (!q && startsBlock(lines[i])) break;
        inner.push(q ? q[1] : lines[i]);
        i++;
      }
      const bq = el('blockquote');
      blocks(inner, bq);
      out.append(bq);
    } else if (LIST.test(line)) {
      i = list(lines, i, out);
    } else if (line.includes('|') && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1])) {
      i = table(lines, i, out);
    } else {
      const para = [line.trim()];
      i++;
      while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) para.push(lines[i++].trim());
      const p = el('p');
      inline(para.join('\n'), p);
      out.append(p);
    }
  }
}

/** The block rendering of one segment as a DocumentFragment. */
export function renderBlocks(text) {
  const frag = document.createDocumentFragment();
  blocks(text.split('\n').map(expandTabs), frag);
  return frag;
}

/**
 * Incremental rendering of a growing Markdown text into `root`.
 * update(text): `text` extends the previous one; finished segments are appended once, the open
 * last segment is re-rendered. Cost per call: the new text plus the open segment.
 */
export class MarkdownView {
  constructor(root) {
    this.root = root;
    this.reset();
  }

  reset() {
    this.root.replaceChildren();
    this.frozen = 0;        // text[0:frozen] is rendered for good
    this.scan = 0;          // start of the first line not scanned yet
    this.fence = null;      // the open fence at `scan`, if any
    this.blank = false;     // the line before `scan` was blank (outside a fence)
    this.live = [];         // the nodes of the open segment
    this.length = 0;
  }

  cuts(text) {
    const out = [];
    for (;;) {
      if (this.blank && !this.fence && this.scan < text.length) {
        const c = text[this.scan];
        if (c !== ' ' && c !== '\t' && c !== '\n' && c !== '\r') {
          out.push(this.scan);
          this.blank = false;
        }
      }
      const nl = text.indexOf('\n', this.scan);
      if (nl < 0) break;
      const line = expandTabs(text.slice(this.scan, nl));
      if (this.fence) {
        if (closesFence(line, this.fence)) this.fence = null;
        this.blank = false;
      } else {
        const m = FENCE_OPEN.exec(line);
        this.fence = m ? m[1] : null;
        this.blank = !m && !line.trim();
      }
      this.scan = nl + 1;
    }
    return out;
  }

  update(text) {
    if (text.length === this.length) return;
    if (text.length < this.length) this.reset();
    this.length = text.length;
    for (const cut of this.cuts(text)) {
      for (const n of this.live) n.remove();
      this.live = [];
      this.root.append(renderBlocks(text.slice(this.frozen, cut)));
      this.frozen = cut;
    }
    for (const n of this.live) n.remove();
    const frag = renderBlocks(text.slice(this.frozen));
    this.live = [...frag.childNodes];
    this.root.append(frag);
  }
}

/** Render the whole of `text` into `root` (the same DOM as MarkdownView fed the text in pieces). */
export function renderMarkdown(text, root) {
  new MarkdownView(root).update(text);
}
