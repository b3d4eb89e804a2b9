// The two ways the page reaches the voice agent. Both deliver the same JSON events (docs/protocol.md):
// WebRTC (Opus both ways, events on a data channel named "events") and, where WebRTC fails, PCM16 over
// the /ws WebSocket (binary frames both ways, events as JSON text).

import {LevelMeter} from './meter.js';

const SAMPLE_RATE = 16000;
const FRAME_SAMPLES = 320; // 20 ms at 16 kHz
const PLAYBACK_CUSHION_S = 0.04;

export class ConnectError extends Error {
  // `fallback` is false when the server itself refused (bad token, full): the WebSocket would fail too.
  constructor(message, fallback = true) {
    super(message);
    this.fallback = fallback;
  }
}

export function openMicrophone() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new ConnectError('this browser gives no microphone here (a secure origin is needed: https or localhost)', false);
  }
  return navigator.mediaDevices.getUserMedia({
    audio: {channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true},
  });
}

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new ConnectError(`${what} timed out after ${ms / 1000} s`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function endpoint(path, token, scheme) {
  const url = new URL(path, window.location.href);
  if (scheme) url.protocol = scheme;
  if (token) url.searchParams.set('token', token);
  return url.toString();
}

async function refusal(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    message = body.message || (body.error && (body.error.message || body.error)) || message;
  } catch (_) { /* not JSON: keep the status line */ }
  // The server said no (auth, capacity, origin): trying the other transport would only fail again.
  const final = [401, 403, 429, 503].includes(response.status);
  return new ConnectError(`the server refused: ${message}`, !final);
}

export class WebRtcTransport {
  constructor({token, onEvent, onClose, audioElement}) {
    this.name = 'WebRTC';
    this.token = token;
    this.onEvent = onEvent;
    this.onClose = onClose;
    this.audio = audioElement;
    this.pc = null;
    this.channel = null;
    this.meter = null;
    this.meterContext = null;
    this.closed = false;
    this.connected = false; // until then a failure is connect()'s to report, not a disconnection
  }

  async connect(microphone) {
    if (typeof RTCPeerConnection === 'undefined') throw new ConnectError('this browser has no WebRTC');
    // No STUN/TURN: the server answers with its own host candidates (loopback included).
    const pc = new RTCPeerConnection({iceServers: []});
    this.pc = pc;
    for (const track of microphone.getAudioTracks()) pc.addTrack(track, microphone);
    const channel = pc.createDataChannel('events', {ordered: true});
    this.channel = channel;
    const opened = new Promise((resolve, reject) => {
      channel.onopen = resolve;
      channel.onclose = () => reject(new ConnectError('the WebRTC data channel closed'));
    });
    channel.onmessage = (message) => this.onEvent(JSON.parse(message.data));
    pc.ontrack = (event) => {
      // Remote audio plays (and even decodes, in Chromium) only through a media element.
      const stream = event.streams[0] || new MediaStream([event.track]);
      this.audio.srcObject = stream;
      this.audio.play().catch(() => { /* autoplay refused: the Start click normally allows it */ });
      this.meterContext = new AudioContext();
      this.meterContext.resume().catch(() => {});
      this.meter = new LevelMeter(this.meterContext, this.meterContext.createMediaStreamSource(stream));
    };
    pc.onconnectionstatechange = () => {
      if (['failed', 'closed'].includes(pc.connectionState)) this.finish(`WebRTC ${pc.connectionState}`);
    };
    await pc.setLocalDescription(await pc.createOffer());
    await this.gathered(2000);
    const response = await withTimeout(fetch(endpoint('webrtc/offer', this.token), {
      method: 'POST',
      headers: {'Content-Type': 'application/json', ...(this.token ? {Authorization: `Bearer ${this.token}`} : {})},
      body: JSON.stringify({type: 'offer', sdp: pc.localDescription.sdp}),
    }), 15000, 'the WebRTC offer');
    if (!response.ok) throw await refusal(response);
    const answer = await response.json();
    await pc.setRemoteDescription({type: 'answer', sdp: answer.sdp});
    await withTimeout(opened, 8000, 'connecting over WebRTC');
    channel.onclose = () => this.finish('the WebRTC data channel closed');
    this.connected = true;
  }

  // Non-trickle signalling: wait until every local candidate is in the offer (or give up waiting).
  gathered(ms) {
    const pc = this.pc;
    if (pc.iceGatheringState === 'complete') return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        if (pc.iceGatheringState === 'complete') {
          pc.removeEventListener('icegatheringstatechange', done);
          resolve();
        }
      };
      pc.addEventListener('icegatheringstatechange', done);
      setTimeout(resolve, ms);
    });
  }

  send(message) {
    if (this.channel && this.channel.readyState === 'open') this.channel.send(JSON.stringify(message));
  }

  flushPlayback() { /* the server drops its queued audio; nothing is buffered here */ }

  // Audio received from the agent so far: RTP totals, and milliseconds of audible voice.
  async receivedAudio() {
    const voicedMs = this.meter ? this.meter.voicedMs : 0;
    if (!this.pc) return {samples: 0, bytes: 0, voicedMs};
    const stats = await this.pc.getStats();
    let samples = 0;
    let bytes = 0;
    stats.forEach((report) => {
      if (report.type === 'inbound-rtp' && report.kind === 'audio') {
        samples += report.totalSamplesReceived || 0;
        bytes += report.bytesReceived || 0;
      }
    });
    return {samples, bytes, voicedMs};
  }

  close() {
    this.send({type: 'session.end'});
    this.finish(null);
  }

  finish(reason) {
    if (this.closed) return;
    this.closed = true;
    if (this.channel) this.channel.close();
    if (this.pc) this.pc.close();
    if (this.meter) this.meter.close();
    if (this.meterContext) this.meterContext.close();
    this.audio.srcObject = null;
    if (this.connected) this.onClose(reason);
  }
}

// Plays PCM16 chunks back to back through WebAudio, a little ahead of the clock.
class PcmPlayer {
  constructor(rate) {
    this.rate = rate;
    this.context = new AudioContext();
    this.output = this.context.createGain();
    this.output.connect(this.context.destination);
    this.meter = new LevelMeter(this.context, this.output);
    this.next = 0;
    this.sources = new Set();
    this.samples = 0;
    this.bytes = 0;
  }

  play(buffer) {
    const pcm = new Int16Array(buffer);
    if (pcm.length === 0) return;
    this.samples += pcm.length;
    this.bytes += buffer.byteLength;
    const audio = this.context.createBuffer(1, pcm.length, this.rate);
    const channel = audio.getChannelData(0);
    for (let i = 0; i < pcm.length; i += 1) channel[i] = pcm[i] / 32768;
    const source = this.context.createBufferSource();
    source.buffer = audio;
    source.connect(this.output);
    const at = Math.max(this.next, this.context.currentTime + PLAYBACK_CUSHION_S);
    source.start(at);
    this.next = at + pcm.length / this.rate;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
  }

  flush() {
    for (const source of this.sources) source.stop();
    this.sources.clear();
    this.next = 0;
  }

  close() {
    this.flush();
    this.meter.close();
    this.context.close();
  }
}

// The microphone as 20 ms PCM16 mono 16 kHz frames, from an AudioWorklet.
async function startCapture(microphone, onFrame) {
  let context = new AudioContext({sampleRate: SAMPLE_RATE});
  let source;
  try {
    source = context.createMediaStreamSource(microphone);
  } catch (_) {
    // Firefox cannot connect a microphone to a context of another rate: capture at the device rate and
    // let the worklet resample.
    await context.close();
    context = new AudioContext();
    source = context.createMediaStreamSource(microphone);
  }
  await context.audioWorklet.addModule(new URL('mic-worklet.js', import.meta.url));
  const node = new AudioWorkletNode(context, 'mic-capture', {
    processorOptions: {targetRate: SAMPLE_RATE, frameSamples: FRAME_SAMPLES},
  });
  node.port.onmessage = (message) => onFrame(message.data);
  const mute = context.createGain();
  mute.gain.value = 0; // the node must reach the destination to be pulled; nobody should hear it
  source.connect(node).connect(mute).connect(context.destination);
  return context;
}

export class WebSocketTransport {
  constructor({token, onEvent, onClose}) {
    this.name = 'WebSocket';
    this.token = token;
    this.onEvent = onEvent;
    this.onClose = onClose;
    this.socket = null;
    this.capture = null;
    this.player = null;
    this.closed = false;
    this.connected = false; // until then a failure is connect()'s to report, not a disconnection
  }

  async connect(microphone) {
    const scheme = window.location.protocol === 'https:' ? 'wss:' : 'ws:';
    const socket = new WebSocket(endpoint('ws', this.token, scheme));
    socket.binaryType = 'arraybuffer';
    this.socket = socket;
    let started;
    const ready = new Promise((resolve, reject) => {
      started = resolve;
      socket.onerror = () => reject(new ConnectError('the WebSocket failed to connect'));
      socket.onclose = (event) => reject(new ConnectError(`the WebSocket closed: ${event.reason || event.code}`, false));
    });
    socket.onopen = () => socket.send(JSON.stringify({
      type: 'session.start', audio: {encoding: 'pcm16', sample_rate: SAMPLE_RATE},
    }));
    socket.onmessage = (message) => {
      if (typeof message.data !== 'string') {
        if (this.player) this.player.play(message.data);
        return;
      }
      const event = JSON.parse(message.data);
      if (event.type === 'session.started') started(event);
      this.onEvent(event);
    };
    const session = await withTimeout(ready, 10000, 'the WebSocket session');
    socket.onclose = (event) => this.finish(event.code === 1000 ? null : `the WebSocket closed: ${event.reason || event.code}`);
    this.player = new PcmPlayer(outputRate(session));
    this.capture = await startCapture(microphone, (frame) => {
      if (socket.readyState === WebSocket.OPEN) socket.send(frame);
    });
    this.connected = true;
  }

  send(message) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(message));
  }

  flushPlayback() {
    if (this.player) this.player.flush();
  }

  async receivedAudio() {
    const player = this.player;
    return player ? {samples: player.samples, bytes: player.bytes, voicedMs: player.meter.voicedMs}
      : {samples: 0, bytes: 0, voicedMs: 0};
  }

  close() {
    this.send({type: 'session.end'});
    this.finish(null);
  }

  finish(reason) {
    if (this.closed) return;
    this.closed = true;
    if (this.socket && this.socket.readyState <= WebSocket.OPEN) this.socket.close(1000);
    if (this.capture) this.capture.close();
    if (this.player) this.player.close();
    if (this.connected) this.onClose(reason);
  }
}

// The agent's audio rate as session.started tells it (16 kHz when it does not say).
function outputRate(session) {
  const audio = session.output_audio || session.output || session.audio || {};
  return audio.sample_rate || session.sample_rate || SAMPLE_RATE;
}
