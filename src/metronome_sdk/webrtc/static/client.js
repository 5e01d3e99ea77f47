// The demo's client: one RTCPeerConnection to POST /offer, a microphone track out, the reply track in,
// and the "events" data channel (JSON: ready, state, transcript, frame, latency, interrupted, stats, error, closed).
"use strict";

const demo = {
  events: [], transcript: [], frames: [], stats: [], latencies: [], interruptions: 0, maxLevel: 0, level: 0, state: "idle", error: null,
};
window.demo = demo;

let pc = null;
let channel = null;
let meterTimer = null;
let analyser = null;
let assistantLine = null;
const $ = (id) => document.getElementById(id);

function setStatus(text) { $("status").textContent = text; demo.state = text; }

function say(role, text, cls) {
  const p = document.createElement("p");
  p.className = cls || role;
  const b = document.createElement("b");
  b.textContent = role + ": ";
  p.appendChild(b);
  p.appendChild(document.createTextNode(text));
  $("transcript").appendChild(p);
  $("transcript").scrollTop = $("transcript").scrollHeight;
  return p;
}

function onEvent(event) {
  demo.events.push(event);
  switch (event.type) {
    case "ready":
      setStatus("connected (session " + event.session_id + ")");
      if (event.deadline) $("deadline").textContent = (event.deadline * 1e3).toFixed(0);
      break;
    case "state":
      $("state").textContent = event.state;
      break;
    case "transcript":
      if (event.role === "user") {
        demo.transcript.push({ role: "user", text: event.text });
        say("you", event.text, "user");
        assistantLine = null;
      } else if (!event.final) {
        if (!assistantLine) { assistantLine = say("model", "", "assistant"); }
        assistantLine.appendChild(document.createTextNode(event.text));
      } else {
        demo.transcript.push({ role: "assistant", text: event.text });
        assistantLine = null;
      }
      break;
    case "frame":
      demo.frames.push(event);
      $("frames").textContent = demo.frames.length;
      $("deadline").textContent = (event.deadline * 1e3).toFixed(0);
      drawLatency();
      break;
    case "latency": {
      demo.latencies.push(event);
      const ms = (x) => (x * 1e3).toFixed(0);
      $("v2v").textContent = ms(event.voice_to_voice);
      $("v2vparts").textContent = "turn end " + ms(event.turn_end) + " + hearing " + ms(event.transcribe) +
        " + first token " + ms(event.first_token) + " + first clause " + ms(event.first_clause) +
        " + voice " + ms(event.synthesize) + " + send " + ms(event.send);
      break;
    }
    case "interrupted":
      demo.interruptions += 1;
      $("interruptions").textContent = demo.interruptions;
      if (assistantLine) assistantLine.appendChild(document.createTextNode(" [interrupted]"));
      break;
    case "stats":
      demo.stats.push(Object.assign({ t: performance.now() / 1e3 }, event));
      if (demo.stats.length > 600) demo.stats.shift();
      showStats(event);
      drawLoad();
      break;
    case "error":
      demo.error = event;
      say("error", event.error + ": " + event.message, "error");
      break;
    case "closed":
      setStatus("closed by the server: " + event.reason);
      break;
  }
}

function showStats(s) {
  const ms = (x) => (x === null || x === undefined ? "-" : (x * 1e3).toFixed(0));
  $("p95").textContent = ms(s.latency_p95);
  $("misses").textContent = s.deadline_misses;
  $("stalls").textContent = s.stalls;
  $("sessions").textContent = s.sessions;
  $("cap").textContent = s.limit;
  $("memcap").textContent = s.memory_limit === null ? "none" : s.memory_limit;
  $("pool").textContent = s.used_blocks + " / " + s.pool_blocks + " (" + (100 * s.occupancy).toFixed(1) + "%)";
  $("tsat").textContent = s.t_sat === null ? "∞" : s.t_sat.toFixed(0) + " s";
}

function axes(ctx, w, h, ymax, unit) {
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = "#ccc"; ctx.fillStyle = "#888"; ctx.font = "20px sans-serif"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = h - 20 - (i / 4) * (h - 40);
    ctx.beginPath(); ctx.moveTo(50, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText((ymax * i / 4).toFixed(0) + unit, 0, y + 6);
  }
}

function drawLatency() {
  const c = $("latency"), ctx = c.getContext("2d"), w = c.width, h = c.height;
  const frames = demo.frames.slice(-300);
  if (!frames.length) return;
  const deadline = frames[frames.length - 1].deadline * 1e3;
  const ymax = Math.max(2 * deadline, ...frames.map((f) => f.latency * 1e3)) * 1.05;
  axes(ctx, w, h, ymax, "");
  const y = (v) => h - 20 - (v / ymax) * (h - 40);
  const x = (i) => 55 + (i / Math.max(1, frames.length - 1)) * (w - 60);
  ctx.strokeStyle = "#c0392b"; ctx.setLineDash([10, 6]); ctx.lineWidth = 3;
  ctx.beginPath(); ctx.moveTo(50, y(deadline)); ctx.lineTo(w, y(deadline)); ctx.stroke(); ctx.setLineDash([]);
  frames.forEach((f, i) => {
    ctx.fillStyle = f.deadline_missed ? "#c0392b" : "#2d6cdf";
    ctx.beginPath(); ctx.arc(x(i), y(f.latency * 1e3), 4, 0, 2 * Math.PI); ctx.fill();
  });
}

function drawLoad() {
  const c = $("load"), ctx = c.getContext("2d"), w = c.width, h = c.height;
  const stats = demo.stats.slice(-240);
  if (!stats.length) return;
  const capMax = Math.max(4, ...stats.map((s) => Math.max(s.limit, s.sessions))) * 1.1;
  axes(ctx, w, h, capMax, "");
  const x = (i) => 55 + (i / Math.max(1, stats.length - 1)) * (w - 60);
  const line = (color, value, ymax) => {
    ctx.strokeStyle = color; ctx.lineWidth = 3; ctx.beginPath();
    stats.forEach((s, i) => {
      const yy = h - 20 - (value(s) / ymax) * (h - 40);
      if (i === 0) ctx.moveTo(x(i), yy); else ctx.lineTo(x(i), yy);
    });
    ctx.stroke();
  };
  line("#8e44ad", (s) => s.limit, capMax);
  line("#2d6cdf", (s) => s.sessions, capMax);
  line("#e67e22", (s) => 100 * s.occupancy, 100);
  ctx.fillStyle = "#e67e22"; ctx.fillText("100%", w - 60, 26);
}

async function meter() {
  // the reply's loudness: WebRTC's own receiver statistics, and the audio graph when it runs
  let level = 0;
  if (pc) {
    const report = await pc.getStats();
    report.forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "audio" && typeof r.audioLevel === "number") {
        level = Math.max(level, r.audioLevel);
      }
    });
  }
  if (analyser) {
    const buf = new Float32Array(analyser.fftSize);
    analyser.getFloatTimeDomainData(buf);
    let sum = 0;
    for (const v of buf) sum += v * v;
    level = Math.max(level, Math.sqrt(sum / buf.length));
  }
  demo.level = level;
  demo.maxLevel = Math.max(demo.maxLevel, level);
  $("energy").textContent = level.toFixed(3);
  $("level").style.width = Math.min(100, level * 300).toFixed(0) + "%";
}

function waitForIce(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const check = () => {
      if (pc.iceGatheringState === "complete") { pc.removeEventListener("icegatheringstatechange", check); resolve(); }
    };
    pc.addEventListener("icegatheringstatechange", check);
  });
}

async function start() {
  $("start").textContent = "Stop"; $("start").className = "stop";
  setStatus("asking for the microphone");
  demo.error = null;
  pc = new RTCPeerConnection();
  channel = pc.createDataChannel("events");
  channel.onmessage = (e) => onEvent(JSON.parse(e.data));
  pc.ontrack = (e) => {
    const stream = e.streams[0] || new MediaStream([e.track]);
    $("audio").srcObject = stream;
    try {
      const ctx = new AudioContext();
      analyser = ctx.createAnalyser();
      analyser.fftSize = 2048;
      ctx.createMediaStreamSource(stream).connect(analyser);
    } catch (err) { analyser = null; }
  };
  pc.onconnectionstatechange = () => {
    if (pc && (pc.connectionState === "failed" || pc.connectionState === "closed")) stop(pc.connectionState);
  };
  const mic = await navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  mic.getTracks().forEach((t) => pc.addTrack(t, mic));
  await pc.setLocalDescription(await pc.createOffer());
  await waitForIce(pc);
  setStatus("connecting");
  const headers = { "Content-Type": "application/json" };
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch("offer", {
    method: "POST", headers, body: JSON.stringify({ sdp: pc.localDescription.sdp, type: pc.localDescription.type }),
  });
  const body = await response.json();
  if (!response.ok) {
    const retry = response.headers.get("Retry-After");
    say("error", body.error + ": " + body.message + (retry ? " (retry after " + retry + " s)" : ""), "error");
    demo.error = body;
    stop("refused (" + response.status + ")");
    return;
  }
  await pc.setRemoteDescription(body);
  meterTimer = setInterval(meter, 100);
}

function stop(why) {
  if (channel && channel.readyState === "open") channel.send(JSON.stringify({ type: "bye" }));
  if (meterTimer) clearInterval(meterTimer);
  meterTimer = null;
  const old = pc;
  pc = null; channel = null;
  if (old) {
    old.getSenders().forEach((s) => s.track && s.track.stop());
    setTimeout(() => old.close(), 200);
  }
  $("start").textContent = "Start"; $("start").className = "";
  if (typeof why === "string") setStatus(why); else setStatus("stopped");
}

$("start").addEventListener("click", () => {
  if (pc) stop(); else start().catch((err) => { say("error", String(err), "error"); stop("failed"); });
});
