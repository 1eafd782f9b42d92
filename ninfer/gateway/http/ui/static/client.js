// The HTTP side of the playground: JSON calls and the streamed chat completion (fetch +
// ReadableStream, server-sent events parsed by hand). Only this origin's public routes are used.

export class APIError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let apiKey = null;
export function setApiKey(key) { apiKey = key || null; }

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

/** An APIError from a failed response: the OpenAI error envelope's message when there is one. */
async function failure(r) {
  let message = `${r.status} ${r.statusText}`;
  let code = null;
  try {
    const body = await r.json();
    if (body && body.error) {
      message = body.error.message || message;
      code = body.error.code || null;
    } else if (body && body.reason) {
      message = `${body.status}: ${body.reason}`;
    }
  } catch { /* not JSON: keep the status line */ }
  return new APIError(r.status, message, code);
}

/** GET or POST a JSON route; the parsed body, or APIError. */
export async function call(path, body = undefined, signal = undefined) {
  const init = body === undefined ? { headers: headers(false), signal }
    : { method: 'POST', headers: headers(true), body: JSON.stringify(body), signal };
  const r = await fetch(path, init);
  if (!r.ok) throw await failure(r);
  return r.json();
}

/** `GET /health`: {ready, status, reason}; a server that cannot be reached says so. */
export async function health() {
  let r;
  try {
    r = await fetch('/health', { cache: 'no-store' });
  } catch {
    return { ready: false, status: 'unreachable', reason: 'the server cannot be reached' };
  }
  let body = {};
  try { body = await r.json(); } catch { /* keep {} */ }
  return { ready: r.ok, status: body.status || String(r.status), reason: body.reason || '' };
}

/**
 * POST /v1/chat/completions with stream: true; `onChunk(obj)` for every data event.
 * Resolves at [DONE] or at the end of the body; rejects with APIError (HTTP error or an error
 * event in the stream) or with the AbortError of `signal`.
 */
export async function streamChat(body, signal, onChunk) {
  const r = await fetch('/v1/chat/completions', {
    method: 'POST', headers: { ...headers(true), Accept: 'text/event-stream' },
    body: JSON.stringify(body), signal,
  });
  if (!r.ok) throw await failure(r);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value.includes('\r') ? value.replace(/\r\n?/g, '\n') : value;
    let start = 0;
    for (let end; (end = buf.indexOf('\n\n', start)) >= 0; start = end + 2) {
      let data = '';
      for (const line of buf.slice(start, end).split('\n')) {
        if (line.startsWith('data:')) data += (data ? '\n' : '') + line.slice(line[5] === ' ' ? 6 : 5);
      }
      if (!data) continue;
      if (data === '[DONE]') { reader.cancel().catch(() => {}); return; }
      const obj = JSON.parse(data);
      if (obj.error) throw new APIError(500, obj.error.message || 'the stream failed', obj.error.code || null);
      onChunk(obj);
    }
    buf = buf.slice(start);
  }
}
