// gridrelay console: the live page's script (#36). Every few seconds it asks the console for
// the journal entries written since its last look (/live/entries) and puts those it has not
// shown at the top of the table. Each look reads again the objects the stream may still have
// been writing; an object is written whole, once, so the objects shown are known by key and
// each entry is shown once. Cells are made with textContent only: an endpoint's answer is
// text, never markup.
"use strict";

(function () {
  const rows = document.getElementById("live-rows");
  if (!rows) return;
  const status = document.getElementById("live-status");
  const newestLine = document.getElementById("live-newest");
  const pause = document.getElementById("live-pause");
  const kept = Number(rows.dataset.kept) || 200;
  const EVERY_MS = 3000;
  let next = Number(rows.dataset.next);
  let newest = newestLine.dataset.newest || null;
  let paused = false;
  let looking = false;
  // The objects shown, with when they were written (ms; null: their names give no time, and
  // every look reads them): forgotten once no look reads them again.
  const shown = new Map(JSON.parse(rows.dataset.objects || "[]"));

  function say(text) {
    status.textContent = text;
  }

  function cell(tr, text, className) {
    const td = tr.insertCell();
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function link(td, text, href) {
    const a = document.createElement("a");
    a.href = href;
    a.textContent = text;
    td.appendChild(a);
  }

  function rowOf(r) {
    const tr = document.createElement("tr");
    tr.dataset.id = r.id;
    link(cell(tr, ""), r.topic + " / " + r.subscription, r.subscription_href);
    cell(tr, r.time);
    cell(tr, r.step);
    const events = cell(tr, "");
    if (r.event && r.event_href) {
      link(events, r.event, r.event_href);
      if (r.more_events > 0) events.append(" and " + r.more_events + " more");
    }
    cell(tr, r.status);
    cell(tr, r.outcome);
    cell(tr, r.ms, "num");
    cell(tr, r.next, "where");
    cell(tr, r.detail, "answer");
    return tr;
  }

  // How old the newest entry read is, counted again at every look.
  function showNewest() {
    if (newest === null) return;
    const age = Math.max(0, Math.round((Date.now() - Date.parse(newest)) / 1000));
    newestLine.textContent = "Newest entry read: " + newest + " (" + age + " s ago).";
  }

  async function look() {
    if (paused || looking) return;
    looking = true;
    try {
      const query = new URLSearchParams(rows.dataset.filter);
      query.set("since", String(next));
      const response = await fetch("/live/entries?" + query, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (response.status === 400) {
        // Its last look is too long ago (a page left paused, a computer asleep): start again.
        window.location.reload();
        return;
      }
      const json = (response.headers.get("content-type") || "").startsWith("application/json");
      if (!json) throw new Error("the console answered " + response.status + " (reload the page)");
      const answer = await response.json();
      if (!response.ok) throw new Error(answer.error || "the console answered " + response.status);
      // Paused while it looked: shown at the next look instead.
      if (paused) return;
      const fresh = answer.rows.filter((r) => !shown.has(r.object));
      for (const r of fresh) {
        rows.insertBefore(rowOf(r), rows.firstChild);
        shown.set(r.object, r.written);
      }
      while (rows.rows.length > kept) rows.deleteRow(-1);
      next = answer.next;
      // Names give seconds: a look reads from the start of its `since`'s second.
      for (const [key, written] of shown) {
        if (written !== null && written + 1000 <= next) shown.delete(key);
      }
      if (answer.newest) newest = answer.newest;
      showNewest();
      if (fresh.length > 0) {
        say(fresh.length + (fresh.length === 1 ? " new entry" : " new entries") + " at " +
          new Date().toLocaleTimeString() + ".");
      } else if (status.dataset.failed) {
        say("Following the journal again.");
      }
      delete status.dataset.failed;
    } catch (e) {
      status.dataset.failed = "yes";
      say("Could not read the journal: " + e.message + ". Trying again.");
    } finally {
      looking = false;
    }
  }

  pause.hidden = false;
  pause.addEventListener("click", function () {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    say(paused ? "Paused: no new entries are shown." : "Following the journal again.");
    if (!paused) look();
  });
  setInterval(look, EVERY_MS);
})();
