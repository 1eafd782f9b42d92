// What the playground keeps in the browser's local storage: conversations, settings, API key.

const CONVERSATIONS = 'ninfer.playground.conversations';
const SETTINGS = 'ninfer.playground.settings';
const KEY = 'ninfer.playground.apiKey';

function read(name, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(name));
    return v ?? fallback;
  } catch {
    return fallback;
  }
}

export function loadConversations() {
  const v = read(CONVERSATIONS, null);
  return v && Array.isArray(v.list) ? v : { list: [], current: null };
}

/** Save; when the quota is exceeded, retry without image data. Returns false if images were dropped. */
export function saveConversations(state) {
  try {
    localStorage.setItem(CONVERSATIONS, JSON.stringify(state));
    return true;
  } catch {
    const slim = JSON.parse(JSON.stringify(state));
    for (const c of slim.list) for (const m of c.messages) if (m.images) m.images = m.images.map(() => null);
    try { localStorage.setItem(CONVERSATIONS, JSON.stringify(slim)); } catch { /* nothing more to drop */ }
    return false;
  }
}

export function loadSettings() { return read(SETTINGS, {}); }
export function saveSettings(s) { try { localStorage.setItem(SETTINGS, JSON.stringify(s)); } catch { /* ignore */ } }
export function loadKey() { return localStorage.getItem(KEY); }
export function saveKey(k) { if (k) localStorage.setItem(KEY, k); else localStorage.removeItem(KEY); }
