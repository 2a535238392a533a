// toolgate console: the little the pages do live. Everything from the bus
// is written with textContent, never as HTML.
"use strict";

function streamURL(params) {
  return "/audit/stream?" + new URLSearchParams(params).toString();
}

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text || "";
  return td;
}

function link(href, text) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

// invocationURL is the page of one call, as the server's callPath makes
// it: tenant and id escaped as path segments, or in the query when one is
// a dot segment no escaping keeps.
function invocationURL(tenant, id) {
  const dots = s => s === "." || s === ".." || s === "";
  if (dots(tenant) || dots(id)) return "/invocations?" + new URLSearchParams({tenant: tenant, id: id}).toString();
  return "/invocations/" + encodeURIComponent(tenant) + "/" + encodeURIComponent(id);
}

function clock(iso) {
  const t = new Date(iso);
  return isNaN(t) ? "-" : t.toISOString().slice(11, 23);
}

// The inbox: when an approval is requested or decided anywhere, fetch the
// list again, unless the person is writing a reason.
function liveInbox() {
  const inbox = document.getElementById("inbox");
  if (!inbox) return;
  let stale = false;
  const busy = () => Array.from(inbox.querySelectorAll("input[name=reason]")).some(i => i.value !== "" || i === document.activeElement);
  const refresh = () => {
    if (busy()) { stale = true; return; }
    stale = false;
    fetch("/approvals", {credentials: "same-origin"}).then(r => r.ok ? r.text() : Promise.reject(r.status)).then(html => {
      // The person may have started writing while the list was fetched.
      if (busy()) { stale = true; return; }
      const doc = new DOMParser().parseFromString(html, "text/html");
      inbox.replaceChildren(...Array.from(doc.body.childNodes));
    }).catch(() => {});
  };
  inbox.addEventListener("focusout", () => { if (stale) setTimeout(refresh, 200); });
  const es = new EventSource(streamURL({type: "tool.approval", after: document.body.dataset.after || "0"}));
  es.onmessage = refresh;
}

// One invocation: reload when its events arrive, until it ends.
function liveInvocation() {
  const st = document.getElementById("status");
  if (!st || !st.dataset.live) return;
  const es = new EventSource(streamURL({q: st.dataset.id, after: document.body.dataset.after || "0"}));
  es.onmessage = () => { es.close(); location.reload(); };
}

// The live audit view: new events on top; Pause holds them until Resume.
function liveAudit() {
  const body = document.getElementById("events");
  const form = document.getElementById("filter");
  if (!body || !form) return;
  const params = Object.fromEntries(new FormData(form).entries());
  params.after = document.body.dataset.after || "0";
  let paused = false;
  const held = [];
  const state = document.getElementById("live-state");
  const show = e => {
    const tr = document.createElement("tr");
    tr.dataset.seq = e.seq;
    tr.dataset.id = e.invocation_id || "";
    const t = cell("");
    t.appendChild(link("/audit/event/" + e.seq, clock(e.time)));
    tr.append(t, cell(e.tenant), cell(e.type), cell(e.tool), cell(e.status), cell(e.ecode));
    const inv = cell("");
    if (e.invocation_id) inv.appendChild(link(invocationURL(e.tenant, e.invocation_id), e.invocation_id));
    tr.append(inv);
    body.prepend(tr);
    while (body.rows.length > 500) body.deleteRow(-1);
  };
  const es = new EventSource(streamURL(params));
  es.onmessage = m => {
    const e = JSON.parse(m.data);
    if (paused) { held.push(e); state.textContent = "paused (" + held.length + " waiting)"; state.classList.add("held"); return; }
    show(e);
  };
  es.onerror = () => { state.textContent = paused ? state.textContent : "reconnecting"; };
  es.onopen = () => { if (!paused) state.textContent = "live"; };
  document.getElementById("pause").addEventListener("click", ev => {
    paused = !paused;
    ev.target.textContent = paused ? "Resume" : "Pause";
    if (!paused) { held.splice(0).forEach(show); state.textContent = "live"; state.classList.remove("held"); } else state.textContent = "paused";
  });
}

function copyButtons() {
  document.querySelectorAll("button[data-copy]").forEach(b => b.addEventListener("click", () => {
    navigator.clipboard.writeText(b.dataset.copy).then(() => { b.textContent = "Copied"; }, () => {});
  }));
}

document.addEventListener("DOMContentLoaded", () => {
  liveInbox();
  liveInvocation();
  liveAudit();
  copyButtons();
});
