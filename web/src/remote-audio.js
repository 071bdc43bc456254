// Counts the remote audio that actually reaches this page, from WebRTC receiver statistics
// (the `inbound-rtp` entries of each subscribed audio track). These counters show that the
// agent's voice arrives and is decoded, which the UI level meter and the e2e test both use.

const COUNTERS = ['packetsReceived', 'bytesReceived', 'totalSamplesReceived', 'totalAudioEnergy'];

export class RemoteAudioStats {
  constructor() {
    this.tracks = new Map(); // track sid -> RemoteAudioTrack, while subscribed
    this.latest = new Map(); // track sid -> last counters seen (kept after unsubscribe)
    this.level = 0; // loudest current audio level over the tracks, 0..1
  }

  add(track) {
    this.tracks.set(track.sid, track);
  }

  remove(track) {
    this.tracks.delete(track.sid);
  }

  /** Totals over every remote audio track seen since the page connected. */
  get totals() {
    const totals = Object.fromEntries(COUNTERS.map((name) => [name, 0]));
    for (const counters of this.latest.values()) {
      for (const name of COUNTERS) totals[name] += counters[name];
    }
    return { ...totals, audioLevel: this.level, tracks: this.latest.size };
  }

  async poll() {
    let level = 0;
    for (const [sid, track] of this.tracks) {
      const report = await track.getRTCStatsReport();
      if (!report) continue;
      for (const stat of report.values()) {
        if (stat.type !== 'inbound-rtp' || stat.kind !== 'audio') continue;
        this.latest.set(sid, Object.fromEntries(COUNTERS.map((name) => [name, stat[name] ?? 0])));
        level = Math.max(level, stat.audioLevel ?? 0);
      }
    }
    this.level = level;
  }
}
