// The live transcript, rebuilt from the text streams that livekit-agents publishes on the
// `lk.transcription` topic (livekit/agents/voice/room_io/_output.py in livekit-agents 1.8.9).
//
// Each transcript segment (one user turn, one agent reply) carries an `lk.segment_id`
// attribute. The agent sends its own reply as ONE stream whose chunks are deltas; it sends
// the user's words as a NEW stream per update, each holding the whole text so far. Both
// cases come out right if a segment shows the accumulated text of its most recent stream.
// A stream whose closing attributes say `lk.transcription_final: "true"` ends the segment.

export const TRANSCRIPTION_TOPIC = 'lk.transcription';
export const SEGMENT_ID_ATTRIBUTE = 'lk.segment_id';
export const FINAL_ATTRIBUTE = 'lk.transcription_final';
export const TRACK_ID_ATTRIBUTE = 'lk.transcribed_track_id';

export class Transcript {
  /** @param {(lines: Array<{id: string, speaker: string, text: string, final: boolean}>) => void} onChange */
  constructor(onChange) {
    this.onChange = onChange;
    this.segments = new Map(); // insertion order = order of first appearance
  }

  get lines() {
    return [...this.segments.values()].map((segment) => ({ ...segment }));
  }

  clear() {
    this.segments.clear();
    this.onChange(this.lines);
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
    let segment = this.segments.get(id);
    if (!segment) {
      segment = { id, speaker, text: '', final: false };
      this.segments.set(id, segment);
    }
    return segment;
  }
}
