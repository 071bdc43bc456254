// The browser client: get a token from our server, join the LiveKit room, publish the
// microphone (with a level meter and mute), play the agent's voice, and show the conversation
// (both sides, in order) and, per reply, how long endpointing and the model took.
//
// Everything the page knows is also kept in `window.omniAgent` (plain data), so the
// e2e test and the devtools console can read it; <body data-state> mirrors the status.
import { MediaDeviceFailure, Room, RoomEvent, Track } from 'livekit-client';
import { RemoteAudioStats } from './remote-audio.js';
import { TRACK_ID_ATTRIBUTE, TRANSCRIPTION_TOPIC, Transcript } from './transcript.js';

const AGENT_STATE_ATTRIBUTE = 'lk.agent.state'; // set by livekit-agents on the agent participant
// set by our agent (agent/vision.py): its AGENT_VISION setting and what it watches now
const VISION_ATTRIBUTE = 'omni.vision';
const WATCHING_ATTRIBUTE = 'omni.vision.watching';
// Our agent's own events (agent/room_events.py): what its VAD hears, one `turn` per reply.
const AGENT_EVENTS_TOPIC = 'omni.agent.events';
const KEPT_AGENT_EVENTS = 100;
const AGENT_JOIN_WARNING_MS = 15000;
const STATS_INTERVAL_MS = 250;

const ui = {
  connect: document.getElementById('connect'),
  disconnect: document.getElementById('disconnect'),
  mute: document.getElementById('mute'),
  camera: document.getElementById('camera'),
  screen: document.getElementById('screen'),
  vision: document.getElementById('vision'),
  preview: document.getElementById('preview'),
  frameSign: document.getElementById('frame-sign'),
  agentVision: document.getElementById('agent-vision'),
  micLevel: document.getElementById('mic-level'),
  micState: document.getElementById('mic-state'),
  replies: document.querySelector('#replies tbody'),
  enableAudio: document.getElementById('enable-audio'),
  status: document.getElementById('status'),
  error: document.getElementById('error'),
  warning: document.getElementById('warning'),
  roomName: document.getElementById('room-name'),
  agentState: document.getElementById('agent-state'),
  agentLevel: document.getElementById('agent-level'),
  userState: document.getElementById('user-state'),
  lastTurn: document.getElementById('last-turn'),
  transcript: document.getElementById('transcript'),
};

const STATUS_TEXT = {
  idle: 'Not connected',
  connecting: 'Connecting…',
  connected: 'Connected: talk to the agent',
  reconnecting: 'Connection lost, reconnecting…',
  disconnected: 'Disconnected',
  error: 'Not connected (see the error)',
};

const state = {
  status: 'idle',
  error: null,
  warning: null,
  room: null,
  identity: null,
  agentIdentity: null,
  agentState: null,
  remoteAudio: new RemoteAudioStats().totals,
  microphone: { enabled: false, muted: false, level: 0 },
  transcript: [],
  // one per agent reply, from its `turn` event: {turn, voiceToVoiceMs, endpointingMs, modelMs,
  // speculative, interrupted}; times null when the agent did not measure them
  replies: [],
  agentEvents: [], // the latest KEPT_AGENT_EVENTS, oldest first
  // video: whether the token lets us publish it; camera/screen: published; the agent's
  // setting and what it watches (its attributes); frames: how many it took with our turns
  vision: { allowed: false, camera: false, screen: false, agent: null, watching: null, frames: 0 },
};
window.omniAgent = state;

let room = null;
let remoteAudio = null;
let statsTimer = null;
let agentJoinTimer = null;

const transcript = new Transcript((lines) => {
  state.transcript = lines;
  renderTranscript();
});

ui.connect.addEventListener('click', () => connect());
ui.disconnect.addEventListener('click', () => disconnect());
ui.mute.addEventListener('click', () => toggleMute());
ui.camera.addEventListener('click', () => toggleVideo('camera'));
ui.screen.addEventListener('click', () => toggleVideo('screen'));
ui.enableAudio.addEventListener('click', async () => {
  await room?.startAudio();
  ui.enableAudio.hidden = room ? room.canPlaybackAudio : true;
});

async function connect() {
  showError(null);
  showWarning(null);
  clearCall();
  setStatus('connecting');
  try {
    requireMicrophoneSupport();
    const details = await fetchToken();
    state.room = details.room;
    state.identity = details.identity;
    state.vision = { ...state.vision, allowed: Boolean(details.video) };
    ui.roomName.textContent = details.room;

    room = createRoom();
    try {
      await room.connect(details.url, details.token);
    } catch (error) {
      throw new Error(
        `Could not connect to the LiveKit server at ${details.url}: ${error.message}. ` +
          'Is it running and reachable from this browser?',
      );
    }
    setStatus('connected');
    // Called inside the click handler, so the browser allows audio playback.
    await room.startAudio();
    await enableMicrophone();
    renderVision();
    watchForAgent();
    statsTimer = setInterval(pollRemoteAudio, STATS_INTERVAL_MS);
  } catch (error) {
    await teardown();
    setStatus('error');
    showError(error.message);
  }
}

async function disconnect() {
  await teardown();
  clearCall();
  setStatus('disconnected');
}

// What the page knew about the call: gone when it ends, so the next call starts clean.
function clearCall() {
  transcript.clear();
  state.agentEvents = [];
  state.replies = [];
  renderReplies();
  state.microphone = { enabled: false, muted: false, level: 0 };
  renderMicrophone();
  ui.userState.textContent = '–';
  ui.lastTurn.textContent = '–';
  state.vision = { allowed: false, camera: false, screen: false, agent: null, watching: null, frames: 0 };
  renderVision();
}

// The camera or the screen, on or off. The agent watches a screen share before the camera.
async function toggleVideo(kind) {
  if (!room) return;
  const on = !state.vision[kind];
  try {
    if (kind === 'camera') await room.localParticipant.setCameraEnabled(on);
    else await room.localParticipant.setScreenShareEnabled(on);
  } catch (error) {
    const what = kind === 'camera' ? 'the camera' : 'screen sharing';
    showError(`Could not ${on ? 'start' : 'stop'} ${what}: ${error.message}`);
    return;
  }
  state.vision = { ...state.vision, [kind]: on };
  renderVision();
}

// A small preview of what the agent may see: the screen share, else the camera.
function renderVision() {
  const { allowed, camera, screen, agent, watching, frames } = state.vision;
  const connected = Boolean(room);
  for (const [button, on, label] of [[ui.camera, camera, 'Camera'], [ui.screen, screen, 'Share screen']]) {
    button.hidden = !allowed;
    button.disabled = !connected;
    button.setAttribute('aria-pressed', String(on));
    button.textContent = on ? `Stop ${label.toLowerCase()}` : label;
  }
  const source = screen ? Track.Source.ScreenShare : camera ? Track.Source.Camera : null;
  const track = source && room ? room.localParticipant.getTrackPublication(source)?.track : null;
  if (track) track.attach(ui.preview);
  else ui.preview.srcObject = null;
  ui.vision.hidden = !track;
  ui.agentVision.textContent = agent == null ? '–'
    : agent === 'off' ? 'nothing (vision off)'
    : `${watching ?? 'none'}${frames ? `, ${frames} frame${frames === 1 ? '' : 's'} taken` : ''}`;
}

// The agent took a frame with your turn: a visible sign for a moment.
function frameTaken(event) {
  state.vision = { ...state.vision, frames: state.vision.frames + (event.frames ?? 1) };
  ui.frameSign.hidden = false;
  ui.frameSign.classList.remove('fresh');
  void ui.frameSign.offsetWidth; // restart the animation
  ui.frameSign.classList.add('fresh');
  renderVision();
}

async function toggleMute() {
  if (!room) return;
  const muted = !state.microphone.muted;
  try {
    await room.localParticipant.setMicrophoneEnabled(!muted);
  } catch (error) {
    showError(`Could not ${muted ? 'mute' : 'unmute'} the microphone: ${error.message}`);
    return;
  }
  state.microphone = { ...state.microphone, muted, level: muted ? 0 : state.microphone.level };
  renderMicrophone();
}

function renderMicrophone() {
  const { enabled, muted, level } = state.microphone;
  ui.mute.disabled = !enabled;
  ui.mute.textContent = muted ? 'Unmute' : 'Mute';
  ui.mute.setAttribute('aria-pressed', String(muted));
  ui.micState.textContent = !enabled ? 'off' : muted ? 'muted' : 'on';
  ui.micLevel.value = muted ? 0 : level;
}

function requireMicrophoneSupport() {
  if (!window.isSecureContext || !navigator.mediaDevices?.getUserMedia) {
    throw new Error(
      'This page cannot use the microphone: browsers allow it only on https:// pages or on ' +
        'http://localhost. Open the page that way.',
    );
  }
}

async function fetchToken() {
  // The server picks the room and the identity. A link the operator signed for a room (and
  // maybe an identity) carries room, identity, expires and sig: they pass through as they are,
  // and the server checks them; a plain ?room= is refused with the reason, which is shown.
  const url = new URL('token', window.location.href);
  const pageParams = new URLSearchParams(window.location.search);
  for (const name of ['room', 'identity', 'expires', 'sig']) {
    if (pageParams.get(name)) url.searchParams.set(name, pageParams.get(name));
  }
  let response;
  try {
    response = await fetch(url, { cache: 'no-store' });
  } catch (error) {
    throw new Error(`Could not reach the token endpoint ${url.pathname}: ${error.message}`);
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    throw new Error(`The token endpoint refused: ${body.error ?? `HTTP ${response.status}`}`);
  }
  return body; // {url, token, room, identity}
}

function createRoom() {
  const newRoom = new Room({
    audioCaptureDefaults: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  const audioStats = new RemoteAudioStats();
  remoteAudio = audioStats;

  newRoom
    .on(RoomEvent.TrackSubscribed, (track) => {
      if (track.kind !== Track.Kind.Audio) return;
      const element = track.attach();
      element.hidden = true;
      document.body.appendChild(element);
      audioStats.add(track);
    })
    .on(RoomEvent.TrackUnsubscribed, (track) => {
      if (track.kind !== Track.Kind.Audio) return;
      track.detach().forEach((element) => element.remove());
      audioStats.remove(track);
    })
    .on(RoomEvent.ParticipantConnected, () => updateAgent())
    .on(RoomEvent.ParticipantDisconnected, () => updateAgent())
    .on(RoomEvent.ParticipantAttributesChanged, () => updateAgent())
    .on(RoomEvent.DataReceived, (payload, participant, kind, topic) => {
      if (topic === AGENT_EVENTS_TOPIC) onAgentEvent(payload);
    })
    .on(RoomEvent.AudioPlaybackStatusChanged, () => {
      ui.enableAudio.hidden = newRoom.canPlaybackAudio;
    })
    .on(RoomEvent.Reconnecting, () => setStatus('reconnecting'))
    .on(RoomEvent.Reconnected, () => setStatus('connected'))
    .on(RoomEvent.Disconnected, (reason) => {
      if (room !== newRoom) return; // we left on purpose
      teardown();
      setStatus('error');
      showError(`The connection to the room ended (reason: ${reason ?? 'unknown'}).`);
    });

  newRoom.registerTextStreamHandler(TRANSCRIPTION_TOPIC, (reader, sender) => {
    transcript.read(reader, speakerOf(newRoom, sender.identity, reader.info.attributes ?? {}));
  });
  return newRoom;
}

// The agent publishes the user's transcript too; it names the user's microphone track in
// an attribute, and the stream is sent on behalf of the user's identity.
function speakerOf(currentRoom, senderIdentity, attributes) {
  const local = currentRoom.localParticipant;
  const trackId = attributes[TRACK_ID_ATTRIBUTE];
  const isUser = senderIdentity === local.identity || (trackId && local.trackPublications.has(trackId));
  return isUser ? 'user' : 'agent';
}

async function enableMicrophone() {
  try {
    await room.localParticipant.setMicrophoneEnabled(true);
    state.microphone = { enabled: true, muted: false, level: 0 };
    renderMicrophone();
  } catch (error) {
    const reasons = {
      [MediaDeviceFailure.PermissionDenied]:
        'Microphone access was denied. Allow it in the browser (the icon in the address bar) and press Connect again.',
      [MediaDeviceFailure.NotFound]: 'No microphone was found. Plug one in and press Connect again.',
      [MediaDeviceFailure.DeviceInUse]: 'The microphone is in use by another application.',
    };
    throw new Error(reasons[MediaDeviceFailure.getFailure(error)] ?? `Could not start the microphone: ${error.message}`);
  }
}

function watchForAgent() {
  updateAgent();
  agentJoinTimer = setTimeout(() => {
    if (!state.agentIdentity) {
      showWarning(
        `No agent joined within ${AGENT_JOIN_WARNING_MS / 1000} s. Check that an agent worker is ` +
          'running and registered with this LiveKit server.',
      );
    }
  }, AGENT_JOIN_WARNING_MS);
}

function updateAgent() {
  const agent = room ? [...room.remoteParticipants.values()].find((p) => p.isAgent) : undefined;
  state.agentIdentity = agent?.identity ?? null;
  state.agentState = agent ? (agent.attributes[AGENT_STATE_ATTRIBUTE] ?? 'joined') : null;
  if (agent) showWarning(null);
  ui.agentState.textContent = agent ? `${agent.identity}: ${state.agentState}` : 'not in the room';
  state.vision = {
    ...state.vision,
    agent: agent?.attributes[VISION_ATTRIBUTE] ?? (agent ? 'off' : null),
    watching: agent?.attributes[WATCHING_ATTRIBUTE] ?? null,
  };
  renderVision();
}

function onAgentEvent(payload) {
  let event;
  try {
    event = JSON.parse(new TextDecoder().decode(payload));
  } catch {
    console.warn('ignored an agent event that is not JSON');
    return;
  }
  state.agentEvents = [...state.agentEvents, event].slice(-KEPT_AGENT_EVENTS);
  if (event.type === 'user_state') {
    ui.userState.textContent = event.state;
  } else if (event.type === 'vision_frame') {
    frameTaken(event);
  } else if (event.type === 'user_turn') {
    transcript.markUserTurn();
  } else if (event.type === 'turn') {
    const reply = {
      turn: event.turn,
      voiceToVoiceMs: ms(event.voice_to_voice_s),
      endpointingMs: ms(event.endpointing_s),
      modelMs: ms(event.model_first_audio_s),
      speculative: Boolean(event.speculative),
      interrupted: Boolean(event.interrupted),
    };
    state.replies = [...state.replies, reply];
    renderReplies();
    const latency = reply.voiceToVoiceMs == null ? '' : `, ${reply.voiceToVoiceMs} ms after you stopped`;
    ui.lastTurn.textContent = `#${reply.turn}${latency}${reply.interrupted ? ' (interrupted)' : ''}`;
  }
}

function ms(seconds) {
  return seconds == null ? null : Math.round(seconds * 1000);
}

function renderReplies() {
  const cell = (value) => {
    const td = document.createElement('td');
    td.textContent = value;
    return td;
  };
  const time = (value) => (value == null ? '–' : `${value} ms`);
  ui.replies.replaceChildren(
    ...state.replies.map((reply) => {
      const row = document.createElement('tr');
      const notes = [reply.speculative ? 'early' : '', reply.interrupted ? 'interrupted' : ''].filter(Boolean);
      row.append(cell(`${reply.turn}`), cell(time(reply.voiceToVoiceMs)), cell(time(reply.endpointingMs)),
        cell(time(reply.modelMs)), cell(notes.join(', ')));
      return row;
    }),
  );
}

async function pollRemoteAudio() {
  const stats = remoteAudio; // teardown may clear it while we await
  if (!stats) return;
  try {
    await stats.poll();
    await pollMicrophone();
  } catch (error) {
    console.warn('could not read WebRTC stats', error);
  }
  state.remoteAudio = stats.totals;
  ui.agentLevel.value = state.remoteAudio.audioLevel;
}

// The microphone's level as WebRTC sends it (the `media-source` stats of the local track).
async function pollMicrophone() {
  const track = room?.localParticipant.getTrackPublication(Track.Source.Microphone)?.track;
  if (!track || state.microphone.muted) return;
  const report = await track.getRTCStatsReport();
  let level = 0;
  for (const stat of report?.values() ?? []) {
    if (stat.type === 'media-source' && stat.kind === 'audio') level = Math.max(level, stat.audioLevel ?? 0);
  }
  state.microphone = { ...state.microphone, level };
  renderMicrophone();
}

async function teardown() {
  clearInterval(statsTimer);
  clearTimeout(agentJoinTimer);
  const leaving = room;
  room = null;
  remoteAudio = null;
  ui.enableAudio.hidden = true;
  await leaving?.disconnect();
  updateAgent();
  state.microphone = { enabled: false, muted: false, level: 0 };
  renderMicrophone();
  state.vision = { ...state.vision, camera: false, screen: false };
  renderVision();
}

function setStatus(status) {
  state.status = status;
  document.body.dataset.state = status;
  ui.status.textContent = STATUS_TEXT[status];
  const busy = status === 'connecting' || status === 'connected' || status === 'reconnecting';
  ui.connect.disabled = busy;
  ui.disconnect.disabled = !busy;
}

function showError(message) {
  state.error = message;
  ui.error.textContent = message ?? '';
  ui.error.hidden = !message;
}

function showWarning(message) {
  state.warning = message;
  ui.warning.textContent = message ?? '';
  ui.warning.hidden = !message;
}

function renderTranscript() {
  ui.transcript.replaceChildren(
    ...state.transcript.map((line) => {
      const item = document.createElement('li');
      item.className = `${line.speaker}${line.final ? '' : ' partial'}`;
      const speaker = document.createElement('span');
      speaker.className = 'speaker';
      speaker.textContent = line.speaker === 'user' ? 'You' : 'Agent';
      item.append(speaker, line.text);
      return item;
    }),
  );
}
