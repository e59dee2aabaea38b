// hadar's status page: polls /v1/status (and /v1/queues where the
// sidecar has team queues) and draws it. Plain DOM calls
// only, text through textContent: job names and reasons come from the
// people who submit jobs, so nothing is ever parsed as HTML.
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const refreshMs = Math.max(500, 1000 * (parseFloat(params.get("refresh")) || 2));
  const SVG = "http://www.w3.org/2000/svg";
  const typeColors = ["#2f6fdf", "#e67e22", "#2e9d5b", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d", "#d4ac0d"];
  let updates = 0;

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "title") e.title = v;
      else if (k.startsWith("data-")) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const k of kids) {
      if (k === null || k === undefined) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // A job's colour: distinct colours in the order jobs first appear,
  // kept for as long as the page is open, so a job keeps its colour as it
  // moves; past the palette, one from a hash of its name.
  const palette = ["#2f6fdf", "#e67e22", "#2e9d5b", "#8e44ad", "#c0392b", "#8d6e63", "#e84393", "#9e9d24",
    "#283593", "#00acc1", "#5d6d7e", "#d4ac0d"];
  const colours = new Map();
  function jobColor(id) {
    if (!colours.has(id)) {
      if (colours.size < palette.length) {
        colours.set(id, palette[colours.size]);
      } else {
        let h = 2166136261;
        for (const c of id) h = Math.imul(h ^ c.charCodeAt(0), 16777619) >>> 0;
        colours.set(id, "hsl(" + (h % 360) + ", 55%, 45%)");
      }
    }
    return colours.get(id);
  }

  function shortJob(id) {
    const s = id.includes("/") ? id.slice(id.indexOf("/") + 1) : id;
    return s.length > 3 ? s.slice(0, 3) : s;
  }

  function duration(s) {
    if (!(s > 0)) return "-";
    s = Math.round(s);
    if (s < 90) return s + "s";
    if (s < 5400) return Math.round(s / 60) + "m";
    if (s < 172800) return (s / 3600).toFixed(1) + "h";
    return (s / 86400).toFixed(1) + "d";
  }

  function clock(t) {
    const d = new Date(t);
    return isNaN(d) || d.getFullYear() < 2000 ? "-" : d.toLocaleTimeString();
  }

  function gpusText(units) {
    return (units || []).map(u => (u.slots || []).map(s => s.count + "\u00d7" + s.type + "@" + (nodeNames[s.node] || s.node.slice(0, 8)) + "/" + s.rack).join("+")).join(" | ");
  }

  // A decision's target placement (planner units: Slots of Node, Type,
  // Count, without racks).
  function decisionGPUs(units) {
    return (units || []).map(u => (u.Slots || []).map(s => s.Count + "\u00d7" + s.Type + "@" + (nodeNames[s.Node] || s.Node.slice(0, 8))).join("+")).join(" | ");
  }

  function fill(tbody, rows, empty, cols) {
    tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colSpan: cols }, empty))]));
  }

  let nodeNames = {};

  function drawSidecar(st) {
    const s = st.sidecar;
    const box = document.getElementById("sidecar");
    const next = (new Date(s.next_round) - new Date(st.time)) / 1000;
    box.replaceChildren(...[
      el("span", {}, el("span", { class: "dot " + (s.ok ? "ok" : "bad") }), s.ok ? "healthy" : "not ready"),
      el("span", {}, "policy ", el("b", {}, s.policy), " / ", s.placement),
      el("span", {}, s.leader ? "leader" : "follower (read only)"),
      s.dry_run ? el("span", { class: "failed" }, "dry run: writes nothing") : null,
      el("span", {}, "round " + s.round + (next > 0 ? ", next in " + duration(next) : "")),
    ].filter(x => x));
    const problem = document.getElementById("problem");
    problem.hidden = !s.problem;
    problem.textContent = s.problem || "";
  }

  function drawGPUs(st) {
    const box = document.getElementById("gpus");
    const cards = st.gpus.map(g => el("div", { class: "gpu-type", "data-type": g.type },
      el("b", {}, g.type), " " + g.total + " GPUs", el("br"),
      el("span", {}, g.allocated + " hadar \u00b7 " + g.unmanaged + " other \u00b7 " + g.idle + " idle")));
    box.replaceChildren(...(cards.length ? cards : [el("span", { class: "muted" }, "no GPUs of a known type")]));
  }

  function drawRacks(st) {
    nodeNames = {};
    for (const r of st.racks) for (const n of r.nodes) nodeNames[n.id] = n.name;
    const racks = st.racks.map(r => el("div", { class: "rack", "data-rack": r.rack },
      el("h3", {}, "rack " + r.rack),
      ...r.nodes.map(n => {
        const off = n.status !== "ready" || !n.schedulable;
        const rows = (n.gpus || []).map(g => {
          const squares = [];
          const holders = [];
          for (const h0 of g.holders || []) {
            // A job of a namespace the caller may not read has no name.
            const h = h0.job ? h0 : Object.assign({}, h0, { job: "a job of another namespace", managed: false });
            for (let i = 0; i < h.count; i++) {
              const sq = el("span", { class: "sq" + (h.managed ? "" : " other"), title: h.job + (h.managed ? "" : " (not managed by hadar)"),
                "data-job": h.job, "data-node": n.name, "data-type": g.type }, h.managed ? shortJob(h.job) : "");
              if (h.managed) sq.style.background = jobColor(h.job);
              squares.push(sq);
            }
            holders.push(h.job + " \u00d7" + h.count);
          }
          const held = squares.length;
          for (let i = held; i < g.total; i++) {
            const healthy = i < g.healthy && !off;
            squares.push(el("span", { class: "sq " + (healthy ? "idle" : "down"), title: healthy ? "idle" : "unhealthy, or its node takes no work",
              "data-node": n.name, "data-type": g.type, "data-idle": healthy ? "1" : "0" }));
          }
          return el("div", {},
            el("div", { class: "gpurow" }, el("span", { class: "type" }, (g.type || "?") + " \u00d7" + g.total), el("span", { class: "squares" }, ...squares)),
            holders.length ? el("div", { class: "holders" }, holders.join(", ")) : null,
            g.type ? null : el("div", { class: "holders" }, "model " + g.models.join(", ") + " not mapped to a GPU type: left out of planning"));
        });
        return el("div", { class: "node" + (off ? " off" : ""), "data-node": n.name },
          el("span", { class: "name" }, n.name), " ", el("span", { class: "muted" }, n.status + (n.schedulable ? "" : ", takes no new work")),
          ...rows);
      })));
    document.getElementById("racks").replaceChildren(...(racks.length ? racks : [el("span", { class: "muted" }, "no nodes")]));
  }

  function jobCell(id) {
    const sw = el("span", { class: "swatch" });
    sw.style.background = jobColor(id);
    return el("td", { class: "job" }, sw, id);
  }

  // An elastic job's widths as hadar.workers takes them: "2-8" for a
  // range, "2,4,8" otherwise (wire.WidthsText).
  function widthsText(ws) {
    const run = ws.every((w, i) => i === 0 || w === ws[i - 1] + 1);
    return run && ws.length > 1 ? ws[0] + "-" + ws[ws.length - 1] : ws.join(",");
  }

  // A running elastic job's width, "2 of 1-4 workers", and the policy's
  // reason for it (issue 35); nothing for a rigid job.
  function widthText(j) {
    if (!j.widths || j.widths.length < 2) return null;
    let n = 0;
    for (const u of j.units || []) for (const s of u.slots) n += s.count;
    return el("div", { class: "width muted", title: j.why || "" }, n + " of " + widthsText(j.widths) + " workers" + (j.why ? ": " + j.why : ""));
  }

  function drawRunning(st) {
    const rows = st.running.map(j => {
      const pct = Math.round(100 * j.progress);
      // How old the progress is: it is the job's last report, read every
      // few seconds (issue 33), against the view's own time.
      const age = j.progress_at ? Math.max(0, Math.round((Date.parse(st.time) - Date.parse(j.progress_at)) / 1000)) : null;
      const asOf = age === null ? "no report yet" : "as of " + (age > 0 ? duration(age) : "0s") + " ago";
      const bar = el("div", { class: "bar", title: Math.round(j.steps_done) + " of " + Math.round(j.steps) + " steps, " + asOf }, el("div"), el("span", {}, pct + "%"));
      bar.firstChild.style.width = pct + "%";
      return el("tr", { "data-job": j.id },
        jobCell(j.id),
        el("td", {}, j.state, widthText(j)),
        el("td", {}, gpusText(j.units)),
        el("td", {}, bar, el("span", { class: "muted" }, " " + asOf)),
        el("td", {}, j.rate > 0 ? j.rate.toFixed(1) + " steps/s" : "-"),
        el("td", { title: j.eta || "" }, j.eta ? duration(j.eta_s) + " (" + clock(j.eta) + ")" : "-"));
    });
    document.getElementById("running-count").textContent = st.running.length ? String(st.running.length) : "";
    fill(document.querySelector("#running tbody"), rows, "no job holds GPUs", 6);
  }

  // A queue reason code (docs/queues.md) as words: waiting_for_reclaim
  // reads "waiting for reclaim".
  function reasonText(code) {
    return code.replace(/_/g, " ");
  }

  // The team queue of a waiting job, and the queue's reason when the
  // queue, not its policy, keeps it waiting.
  function teamQueue(j) {
    if (!j.team_queue) return null;
    return el("div", { class: "team-queue" }, "queue " + j.team_queue,
      j.queue_reason ? el("span", { class: "badge queue-reason", title: j.queue_reason }, reasonText(j.queue_reason)) : null);
  }

  function drawQueue(st) {
    const rows = st.queue.map(j => el("tr", { "data-job": j.id, "data-waits": j.waits || "", "data-team-queue": j.team_queue || "", "data-queue-reason": j.queue_reason || "" },
      el("td", {}, String(j.position)),
      jobCell(j.id),
      el("td", {}, j.waits ? el("span", { class: "badge " + j.waits }, j.waits === "held" ? "held by hadar" : "no capacity") : j.state),
      el("td", {}, duration(j.waiting_s)),
      el("td", {}, (j.widths && j.widths.length > 1 ? widthsText(j.widths) : j.workers) + "\u00d7 " + (j.runs_on.length ? j.runs_on.join(", ") : "none")),
      el("td", {}, j.why || "", teamQueue(j), j.nomad ? el("div", { class: "nomad" }, "Nomad: " + j.nomad) : null)));
    document.getElementById("queue-count").textContent = st.queue.length ? String(st.queue.length) : "";
    fill(document.querySelector("#queue tbody"), rows, "no job waits", 6);
    const refused = document.getElementById("refused-section");
    refused.hidden = !st.refused.length;
    fill(document.querySelector("#refused tbody"), st.refused.map(r => el("tr", { "data-job": r.job }, el("td", { class: "job" }, r.job), el("td", {}, r.error))), "", 2);
  }

  // GPUs per type ({"v100": 4, "k80": 2}) as "2 k80, 4 v100"; "-" for
  // none. Queues count GPUs per type, not in a normalized unit.
  function typeCounts(m) {
    const types = Object.keys(m || {}).sort();
    return types.length ? types.map(t => m[t] + " " + t).join(", ") : "-";
  }

  // The team queues (GET /v1/queues): null when the sidecar has none,
  // and the section stays hidden.
  function drawQueues(qv) {
    const section = document.getElementById("queues-section");
    section.hidden = !qv;
    if (!qv) return;
    const rows = qv.queues.map(q => {
      // The waiting jobs the caller may read, by the queue's reason
      // ("policy": the queue's own policy decided within its share).
      const waiting = {};
      for (const j of q.jobs || []) {
        if (j.running) continue;
        const code = j.code || "policy";
        waiting[code] = (waiting[code] || 0) + 1;
      }
      const why = Object.keys(waiting).sort().map(c => reasonText(c) + " \u00d7" + waiting[c]).join(", ");
      const reclaimed = q.reclaimed_total || 0, fair = q.fair_share_preempted_total || 0;
      return el("tr", { "data-queue": q.name },
        el("td", { class: "job" }, q.name),
        el("td", {}, q.policy || "-"),
        el("td", { title: q.scaled ? "scaled down: the cluster has fewer GPUs than the guarantees add up to" : "" }, typeCounts(q.guarantee) + (q.scaled ? " (scaled)" : "")),
        el("td", {}, typeCounts(q.used)),
        el("td", {}, typeCounts(q.borrowed)),
        el("td", {}, Object.keys(q.limit || {}).length ? typeCounts(q.limit) : "none"),
        el("td", {}, String(q.pending), why ? el("div", { class: "nomad" }, why) : null),
        el("td", {}, String(q.admitted)),
        el("td", { title: "jobs preempted to give another queue its guarantee back, and for fair sharing" }, reclaimed || fair ? reclaimed + " reclaim, " + fair + " fair share" : "-"),
        el("td", {}, (q.namespaces || []).join(", ") || "-", el("div", { class: "nomad" }, "weight " + q.weight)));
    });
    document.getElementById("queues-count").textContent = qv.queues.length ? String(qv.queues.length) : "";
    fill(document.querySelector("#queues tbody"), rows, "no queue to show: no plan yet, or none with a namespace you may read", 10);
  }

  function drawDecisions(st) {
    const rows = st.decisions.slice().reverse().map(d => el("tr", { "data-job": d.job, "data-action": d.action || "" },
      el("td", {}, clock(d.time)),
      jobCell(d.job),
      el("td", {}, el("span", { class: "action " + (d.action || "") }, d.action || "outcome")),
      el("td", {}, decisionGPUs(d.to)),
      el("td", {}, d.why || "", d.result ? el("div", { class: d.result.startsWith("failed") || d.result.startsWith("not applied") ? "failed" : "muted" }, d.result) : null)));
    fill(document.querySelector("#decisions tbody"), rows, "no decision yet", 5);
  }

  // The utilisation plot: one line per GPU type, the share of its GPUs
  // held (by hadar's jobs or others) over time.
  function drawPlot(st) {
    const pts = st.utilisation || [];
    const box = document.getElementById("plot");
    const W = 720, H = 200, L = 40, R = 110, T = 10, B = 26;
    const s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "GPU utilisation per type over time" });
    for (const y of [0, 0.5, 1]) {
      const py = T + (1 - y) * (H - T - B);
      s.append(svg("line", { x1: L, x2: W - R, y1: py, y2: py, stroke: "#dde1e8" }));
      s.append(svg("text", { x: L - 6, y: py + 4, "text-anchor": "end" }, Math.round(100 * y) + "%"));
    }
    if (pts.length < 2) {
      s.append(svg("text", { x: L + 10, y: H / 2 }, "collecting samples\u2026"));
      box.replaceChildren(s);
      return;
    }
    const t0 = new Date(pts[0].time).getTime(), t1 = new Date(pts[pts.length - 1].time).getTime();
    const x = t => L + (t - t0) / Math.max(1, t1 - t0) * (W - L - R);
    const types = [...new Set(pts.flatMap(p => Object.keys(p.types || {})))].sort();
    types.forEach((typ, i) => {
      const color = typeColors[i % typeColors.length];
      const coords = pts.filter(p => p.types && p.types[typ] && p.types[typ].total > 0).map(p => {
        const u = p.types[typ];
        const busy = (u.allocated + u.unmanaged) / u.total;
        return x(new Date(p.time).getTime()).toFixed(1) + "," + (T + (1 - busy) * (H - T - B)).toFixed(1);
      });
      s.append(svg("polyline", { points: coords.join(" "), fill: "none", stroke: color, "stroke-width": 2, "data-type": typ }));
      const last = pts[pts.length - 1].types[typ];
      const label = last && last.total > 0 ? Math.round(100 * (last.allocated + last.unmanaged) / last.total) + "%" : "";
      s.append(svg("rect", { x: W - R + 12, y: T + 4 + 18 * i, width: 10, height: 10, fill: color }));
      s.append(svg("text", { x: W - R + 27, y: T + 13 + 18 * i }, typ + " " + label));
    });
    s.append(svg("text", { x: L, y: H - 6 }, clock(pts[0].time)));
    s.append(svg("text", { x: W - R, y: H - 6, "text-anchor": "end" }, clock(pts[pts.length - 1].time)));
    box.replaceChildren(s);
  }

  function draw(st, qv) {
    drawSidecar(st);
    drawGPUs(st);
    drawQueues(qv);
    drawRacks(st);
    drawRunning(st);
    drawQueue(st);
    drawDecisions(st);
    drawPlot(st);
    updates++;
    document.body.dataset.updates = String(updates);
    document.body.dataset.statusTime = st.time;
    document.getElementById("updated").textContent = "updated " + clock(st.time);
  }

  // The token for a status API that asks for one (docs/status.md,
  // "Authentication"): typed once, kept for this tab only.
  const tokenKey = "hadar-status-token";
  let asking = false;

  function askToken(problem, why) {
    if (asking) return;
    asking = true;
    const input = el("input", { type: "password", id: "token", autocomplete: "off", placeholder: "token", });
    const button = el("button", { type: "button", id: "token-submit" }, "show");
    const use = () => {
      if (input.value.trim()) sessionStorage.setItem(tokenKey, input.value.trim());
      asking = false;
      problem.hidden = true;
      problem.replaceChildren();
    };
    button.addEventListener("click", use);
    input.addEventListener("keydown", e => { if (e.key === "Enter") use(); });
    problem.hidden = false;
    problem.replaceChildren(el("span", {}, why + " "), input, button);
  }

  // GET /v1/queues: null where the sidecar has no queue blocks (it
  // answers 404 then).
  async function readQueues(headers) {
    const r = await fetch("/v1/queues", { cache: "no-store", headers });
    if (r.status === 404) return null;
    if (!r.ok) throw new Error("/v1/queues: HTTP " + r.status);
    return r.json();
  }

  async function poll() {
    const problem = document.getElementById("problem");
    try {
      const headers = {};
      const tok = sessionStorage.getItem(tokenKey);
      if (tok) headers["Authorization"] = "Bearer " + tok;
      const r = await fetch("/v1/status", { cache: "no-store", headers });
      if (r.status === 401) {
        if (tok) sessionStorage.removeItem(tokenKey);
        askToken(problem, tok ? "the sidecar refused the token; another:" : "the sidecar asks for a token (its status API token, or a Nomad ACL token where it accepts them):");
      } else {
        if (!r.ok) throw new Error("HTTP " + r.status);
        const st = await r.json();
        draw(st, st.sidecar && st.sidecar.team_queues ? await readQueues(headers) : null);
      }
    } catch (e) {
      if (!asking) {
        problem.hidden = false;
        problem.textContent = "cannot read the sidecar's status: " + e.message + " (retrying)";
      }
    }
    setTimeout(poll, refreshMs);
  }

  poll();
})();
