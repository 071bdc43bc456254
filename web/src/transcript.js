// The live transcript, rebuilt from the text streams that livekit-agents publishes on the
// `lk.transcription` topic (livekit/agents/voice/room_io/_output.py in livekit-agents 1.8.9).
//
// Each transcript segment (one user turn, one agent reply) carries an `lk.segment_id`
// attribute. The agent sends its own reply as ONE stream whose chunks are deltas; it sends
// the user's words as a NEW stream per update, each holding the whole text so far. Both
// cases come out right if a segment shows the accumulated text of its most recent stream.
// A stream whose closing attributes say `lk.transcription_final: "true"` ends the segment.
//
// Order: the user's words are transcribed after their turn is committed, so they often arrive
// after the agent's reply to them has begun. The agent's `user_turn` event marks each commit
// (`markUserTurn`); a user segment that appears after it goes before the agent segments that
// began after that mark, i.e. before the reply it prompted.

export const TRANSCRIPTION_TOPIC = 'lk.transcription';
export const SEGMENT_ID_ATTRIBUTE = 'lk.segment_id';
export const FINAL_ATTRIBUTE = 'lk.transcription_final';
export const TRACK_ID_ATTRIBUTE = 'lk.transcribed_track_id';

export class Transcript {
  /** @param {(lines: Array<{id: string, speaker: string, text: string, final: boolean}>) => void} onChange */
  constructor(onChange) {
    this.onChange = onChange;
    this.segments = []; // in conversation order
    this.lastUserTurnAt = -Infinity; // page clock (performance.now()) of the latest user turn
  }

  get lines() {
    return this.segments.map(({ id, speaker, text, final }) => ({ id, speaker, text, final }));
  }

  clear() {
    this.segments = [];
    this.lastUserTurnAt = -Infinity;
    this.onChange(this.lines);
  }

  /** The agent committed a user turn (its `user_turn` event arrived). */
  markUserTurn() {
    this.lastUserTurnAt = performance.now();
  }

  /**
   * Reads one `lk.transcription` stream to its end.
   * @param {import('livekit-client').TextStreamReader} reader
   * @param {'user' | 'agent'} speaker
   */
  async read(reader, speaker) {
    const attributes = reader.info.attributes ?? {};
    const id = attributes[SEGMENT_ID_ATTRIBUTE] ?? reader.info.id;
    const segment = this.#segment(id, speaker);
    let text = '';
    try {
      for await (const chunk of reader) {
        text += chunk;
        segment.text = text;
        this.onChange(this.lines);
      }
    } catch (error) {
      // The sender aborted the stream (e.g. it left): keep what arrived.
      console.warn('transcription stream ended abnormally', error);
    }
    // The closing attributes are merged into reader.info once the stream has ended.
    if (reader.info.attributes?.[FINAL_ATTRIBUTE] === 'true') {
      segment.final = true;
    }
    this.onChange(this.lines);
  }

  #segment(id, speaker) {
    let segment = this.segments.find((s) => s.id === id);
    if (!segment) {
      segment = { id, speaker, text: '', final: false, startedAt: performance.now() };
      let at = this.segments.length;
      if (speaker === 'user') {
        // before the reply (agent segments begun since the turn was committed)
        const reply = this.segments.findIndex((s) => s.speaker === 'agent' && s.startedAt >= this.lastUserTurnAt);
        if (reply >= 0) at = reply;
      }
      this.segments.splice(at, 0, segment);
    }
    return segment;
  }
}
