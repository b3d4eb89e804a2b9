// How loud the agent's voice is as it plays: drives the level bar and counts the milliseconds of voice
// heard (the browser tests check it, so "audio received" means audible audio, not Opus silence).

const POLL_MS = 50;
const VOICED_PEAK = 0.02; // about -34 dBFS

export class LevelMeter {
  constructor(context, source) {
    this.context = context;
    this.analyser = context.createAnalyser();
    this.analyser.fftSize = 2048;
    source.connect(this.analyser);
    // Chromium pulls audio through a graph only towards the destination: connect, silenced.
    this.sink = context.createGain();
    this.sink.gain.value = 0;
    this.analyser.connect(this.sink).connect(context.destination);
    this.samples = new Float32Array(this.analyser.fftSize);
    this.voicedMs = 0;
    this.level = 0;
    this.timer = setInterval(() => this.poll(), POLL_MS);
  }

  poll() {
    this.analyser.getFloatTimeDomainData(this.samples);
    let peak = 0;
    for (const x of this.samples) peak = Math.max(peak, Math.abs(x));
    this.level = peak;
    if (peak > VOICED_PEAK) this.voicedMs += POLL_MS;
    const bar = document.getElementById('agent-level');
    if (bar) bar.style.transform = `scaleX(${Math.min(1, peak * 2).toFixed(3)})`;
  }

  close() {
    clearInterval(this.timer);
    const bar = document.getElementById('agent-level');
    if (bar) bar.style.transform = 'scaleX(0)';
  }
}
