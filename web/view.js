// Rendering of committed blocks, the running speculative-decoding figures and the latency waterfall.

// A committed block is the draft tokens the target accepted plus one token of the target's own: a
// correction when it rejected a draft token, a bonus when it accepted them all (or plain decoding).
export function blockKind(event) {
  const drafted = event.n_drafted ?? 0;
  const accepted = event.n_accepted ?? 0;
  if (!drafted) return 'plain';
  return accepted < drafted ? 'corrected' : 'bonus';
}

function chip(kind) {
  const element = document.createElement('span');
  element.className = `chip ${kind}`;
  return element;
}

export function renderBlock(event, strip) {
  const kind = blockKind(event);
  const drafted = event.n_drafted ?? 0;
  const accepted = event.n_accepted ?? 0;
  const span = document.createElement('span');
  span.className = `block ${kind}`;
  span.textContent = event.text;
  span.dataset.drafted = drafted;
  span.dataset.accepted = accepted;
  span.title = kind === 'plain' ? 'plain decoding: no draft'
    : `${accepted} of ${drafted} drafted tokens accepted, then 1 ${kind === 'bonus' ? 'bonus' : 'corrected'} token`;
  const group = document.createElement('span');
  group.className = 'group';
  for (let i = 0; i < accepted; i += 1) group.append(chip('accepted'));
  group.append(chip(kind));
  strip.append(group);
  return span;
}

export class Stats {
  constructor() {
    this.drafted = 0;
    this.accepted = 0;
    this.passes = 0; // target forward passes that committed a block
    this.tokens = 0;
    this.turns = new Map(); // turn -> {asked, last, tokens}: when the transcript came, the last block
    this.serverMsPerToken = [];
    this.voiceToVoice = null;
  }

  asked(turn, now) {
    this.turns.set(turn, {asked: now, last: now, tokens: 0});
  }

  block(turn, event, now) {
    const drafted = event.n_drafted ?? 0;
    const accepted = event.n_accepted ?? 0;
    const tokens = event.n_tokens ?? accepted + 1;
    this.drafted += drafted;
    this.accepted += accepted;
    this.passes += 1;
    this.tokens += tokens;
    const timing = this.turns.get(turn) || {asked: now, last: now, tokens: 0};
    timing.last = now;
    timing.tokens += tokens;
    this.turns.set(turn, timing);
  }

  metrics(event) {
    const latency = latencies(event);
    if (latency.voice_to_voice != null) this.voiceToVoice = latency.voice_to_voice;
    const msPerToken = event.ms_per_token ?? (event.llm && event.llm.ms_per_token);
    if (msPerToken != null) this.serverMsPerToken.push(msPerToken);
  }

  // Milliseconds per committed token: the server's figure when it sends one, else measured here from
  // the final transcript to the turn's last block (the prompt's prefill included: a voice agent pays it).
  msPerToken() {
    if (this.serverMsPerToken.length) {
      return this.serverMsPerToken.reduce((a, b) => a + b, 0) / this.serverMsPerToken.length;
    }
    let span = 0;
    let tokens = 0;
    for (const timing of this.turns.values()) {
      span += timing.last - timing.asked;
      tokens += timing.tokens;
    }
    return tokens ? span / tokens : null;
  }

  render() {
    const set = (id, text) => { document.getElementById(id).textContent = text; };
    set('stat-acceptance', this.drafted ? `${Math.round((100 * this.accepted) / this.drafted)}%  (${this.accepted}/${this.drafted})` : '–');
    set('stat-per-pass', this.passes ? (this.tokens / this.passes).toFixed(2) : '–');
    const ms = this.msPerToken();
    set('stat-ms-per-token', ms == null ? '–' : `${ms.toFixed(0)} ms`);
    set('stat-v2v', this.voiceToVoice == null ? '–' : `${Math.round(this.voiceToVoice)} ms`);
  }
}

// The latencies of a turn.metrics event, in ms from the end of the user's speech.
export function latencies(event) {
  return event.latency_ms || event.latencies_ms || event.latencies || event;
}

const STAGES = [
  ['asr', 'asr_final', 'final transcript'],
  ['llm', 'first_block', 'first block'],
  ['tts', 'tts_first_audio', 'first synthesized audio'],
  ['out', 'voice_to_voice', 'first audio sent'],
];

export function renderWaterfallRow(event) {
  const latency = latencies(event);
  const total = Math.max(...STAGES.map(([, key]) => latency[key] ?? 0), 1);
  const scale = Math.max(total, 1000); // a fixed floor, so short turns look short
  const row = document.createElement('li');
  const label = document.createElement('span');
  label.className = 'label';
  const turn = event.turn ?? event.turn_id;
  label.textContent = `turn ${turn ?? '?'}: ${Math.round(latency.voice_to_voice ?? total)} ms`;
  const bar = document.createElement('span');
  bar.className = 'bar';
  let previous = 0;
  for (const [kind, key, name] of STAGES) {
    const at = latency[key];
    if (at == null) continue;
    const segment = document.createElement('span');
    segment.className = `segment ${kind}`;
    segment.style.left = `${(100 * previous) / scale}%`;
    segment.style.width = `${(100 * Math.max(at - previous, 0)) / scale}%`;
    segment.title = `${name} at ${Math.round(at)} ms (+${Math.round(at - previous)} ms)`;
    bar.append(segment);
    previous = Math.max(previous, at);
  }
  row.append(label, bar);
  return row;
}
