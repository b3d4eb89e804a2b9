// The voice demo: Start/Stop, the conversation, and what speculative decoding does, live.
// Events follow docs/protocol.md; the transport (WebRTC first, WebSocket PCM as the fallback) is in
// transports.js. `?token=` passes an API key; `?transport=ws` or `?transport=webrtc` forces one.

import {ConnectError, WebRtcTransport, WebSocketTransport, openMicrophone} from './transports.js';
import {Stats, renderBlock, renderWaterfallRow} from './view.js';

const params = new URLSearchParams(window.location.search);
const token = params.get('token') || '';
const forced = params.get('transport');
const $ = (id) => document.getElementById(id);

const ui = {
  start: $('start'), stop: $('stop'), status: $('status'), error: $('error'),
  transcript: $('transcript'), agent: $('agent'), waterfall: $('waterfall'),
  typed: $('typed'), typedText: $('typed-text'), audio: $('agent-audio'),
};

// For people and for the browser tests: what is connected and what came in.
const state = {transport: null, microphone: null, events: [], turns: new Map(), stats: new Stats()};
window.voiceagent = {
  get transport() { return state.transport ? state.transport.name : null; },
  get events() { return state.events; },
  receivedAudio: () => (state.transport ? state.transport.receivedAudio() : {samples: 0, bytes: 0, voicedMs: 0}),
};

function setStatus(text, kind) {
  ui.status.textContent = text;
  ui.status.dataset.state = kind;
}

function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = !message;
}

function turnOf(event) {
  const id = event.turn ?? event.turn_id ?? 0;
  if (!state.turns.has(id)) state.turns.set(id, {id, user: null, agent: null, blocks: null});
  return state.turns.get(id);
}

function userLine(turn) {
  if (!turn.user) {
    turn.user = document.createElement('p');
    turn.user.className = 'utterance partial';
    ui.transcript.append(turn.user);
  }
  return turn.user;
}

function agentLine(turn) {
  if (!turn.agent) {
    turn.agent = document.createElement('p');
    turn.agent.className = 'reply';
    turn.blocks = document.createElement('span');
    turn.blocks.className = 'tokens';
    turn.blocks.setAttribute('aria-hidden', 'true');
    const line = document.createElement('div');
    line.className = 'turn';
    line.append(turn.agent, turn.blocks);
    ui.agent.append(line);
  }
  return turn.agent;
}

function scrollDown(element) {
  element.scrollTop = element.scrollHeight;
}

function handle(event) {
  state.events.push(event);
  const turn = turnOf(event);
  switch (event.type) {
    case 'session.started':
      setStatus(`listening (${state.transport.name})`, 'listening');
      break;
    case 'vad.speech_start':
      userLine(turn);
      setStatus('hearing you', 'hearing');
      break;
    case 'vad.speech_end':
      setStatus('thinking', 'thinking');
      break;
    case 'transcript.partial':
      userLine(turn).textContent = event.text || '';
      scrollDown(ui.transcript);
      break;
    case 'transcript.final':
      if (event.text) {
        state.stats.asked(turn.id, performance.now());
        const line = userLine(turn);
        line.textContent = event.text;
        line.className = 'utterance';
      } else if (turn.user) {
        turn.user.remove();
        turn.user = null;
      }
      scrollDown(ui.transcript);
      break;
    case 'agent.block':
      agentLine(turn).append(renderBlock(event, turn.blocks));
      state.stats.block(turn.id, event, performance.now());
      state.stats.render();
      scrollDown(ui.agent);
      break;
    case 'agent.audio.start':
      setStatus('speaking', 'speaking');
      break;
    case 'agent.audio.end':
      setStatus(`listening (${state.transport.name})`, 'listening');
      break;
    case 'agent.paused':  // the user speaks over the reply: it waits, and goes on if they said no words
      setStatus('paused: listening', 'listening');
      break;
    case 'agent.resumed':
      setStatus('speaking', 'speaking');
      break;
    case 'interrupted':
      if (turn.agent) turn.agent.classList.add('interrupted');
      state.transport.flushPlayback();
      break;
    case 'turn.metrics':
      ui.waterfall.prepend(renderWaterfallRow(event));
      while (ui.waterfall.children.length > 6) ui.waterfall.lastElementChild.remove();
      state.stats.metrics(event);
      state.stats.render();
      break;
    case 'error':
      showError(`${event.message || 'the server reported an error'}${event.code ? ` (${event.code})` : ''}`);
      break;
    default:
      break; // events this page does not show
  }
}

function closed(reason) {
  if (state.microphone) state.microphone.getTracks().forEach((track) => track.stop());
  state.microphone = null;
  state.transport = null;
  ui.start.disabled = false;
  ui.stop.disabled = true;
  ui.typedText.disabled = true;
  ui.typed.querySelector('button').disabled = true;
  setStatus('idle', 'idle');
  if (reason) showError(`Disconnected: ${reason}`);
}

async function connectWith(Transport) {
  const transport = new Transport({token, onEvent: handle, onClose: closed, audioElement: ui.audio});
  state.transport = transport;
  setStatus(`connecting (${transport.name})`, 'connecting');
  try {
    await transport.connect(state.microphone);
    return transport;
  } catch (error) {
    transport.finish(null);
    state.transport = null;
    throw error;
  }
}

async function start() {
  ui.start.disabled = true;
  showError('');
  try {
    state.microphone = await openMicrophone();
    const order = forced === 'ws' ? [WebSocketTransport]
      : forced === 'webrtc' ? [WebRtcTransport] : [WebRtcTransport, WebSocketTransport];
    let lastError = null;
    for (const Transport of order) {
      try {
        await connectWith(Transport);
        break;
      } catch (error) {
        lastError = error;
        console.warn(`voiceagent: ${Transport.name} failed:`, error);
        if (error instanceof ConnectError && !error.fallback) break;
      }
    }
    if (!state.transport) throw lastError || new Error('no transport connected');
    ui.stop.disabled = false;
    ui.typedText.disabled = false;
    ui.typed.querySelector('button').disabled = false;
  } catch (error) {
    closed(null);
    const message = error && error.name === 'NotAllowedError' ? 'microphone permission was denied' : error.message;
    showError(`Could not start: ${message}`);
  }
}

function stop() {
  if (state.transport) state.transport.close();
  else closed(null);
}

ui.start.addEventListener('click', start);
ui.stop.addEventListener('click', stop);
ui.typed.addEventListener('submit', (event) => {
  event.preventDefault();
  const text = ui.typedText.value.trim();
  if (!text || !state.transport) return;
  state.transport.send({type: 'input.text', text});
  ui.typedText.value = '';
});
window.addEventListener('pagehide', stop);

// Keep ?token= when switching to the forced WebSocket link.
const forceWs = document.querySelector('a[href="?transport=ws"]');
if (forceWs && token) forceWs.href = `?transport=ws&token=${encodeURIComponent(token)}`;
