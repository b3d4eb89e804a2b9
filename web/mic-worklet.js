// AudioWorklet: the microphone as PCM16 mono frames of `frameSamples` at `targetRate`, posted as
// ArrayBuffers. Channels are averaged. When the context runs at another rate (Firefox keeps the device
// rate), each output sample is the mean of the input samples it covers: a box filter, enough to keep
// speech free of aliasing on the way down to 16 kHz.

class MicCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const {targetRate, frameSamples} = options.processorOptions;
    this.step = sampleRate / targetRate; // input samples per output sample
    this.frameSamples = frameSamples;
    this.frame = new Int16Array(frameSamples);
    this.filled = 0;
    this.sum = 0;
    this.count = 0;
    this.position = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;
    const length = channels[0].length;
    for (let i = 0; i < length; i += 1) {
      let x = 0;
      for (const channel of channels) x += channel[i];
      x /= channels.length;
      if (this.step === 1) {
        this.emit(x);
        continue;
      }
      this.sum += x;
      this.count += 1;
      this.position += 1;
      if (this.position >= this.step) {
        this.emit(this.sum / this.count);
        this.position -= this.step;
        this.sum = 0;
        this.count = 0;
      }
    }
    return true;
  }

  emit(x) {
    const clipped = Math.max(-1, Math.min(1, x));
    this.frame[this.filled] = clipped < 0 ? clipped * 32768 : clipped * 32767;
    this.filled += 1;
    if (this.filled === this.frameSamples) {
      this.port.postMessage(this.frame.buffer, [this.frame.buffer]);
      this.frame = new Int16Array(this.frameSamples);
      this.filled = 0;
    }
  }
}

registerProcessor('mic-capture', MicCapture);
