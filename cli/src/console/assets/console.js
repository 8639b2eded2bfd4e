// The outbox console's page. Every value from the database (payloads, keys, topics, errors,
// which producers and receivers control) is set as text, never as markup: the page builds its
// elements with el() and text nodes only.
"use strict";

(function () {
  const main = document.getElementById("main");
  const notice = document.getElementById("notice");
  let session = null;
  let refreshTimer = null;

  // An element with attributes and children; a string child is a text node.
  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (name === "onclick" || name === "onsubmit" || name === "onchange") {
        node.addEventListener(name.slice(2), value);
      } else if (value !== null && value !== undefined && value !== false) {
        node.setAttribute(name, value === true ? "" : String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
    }
    return node;
  }

  function show(message, isError) {
    notice.hidden = false;
    notice.className = isError ? "error" : "";
    notice.textContent = message;
  }

  function clearNotice() {
    notice.hidden = true;
    notice.textContent = "";
  }

  async function get(path) {
    const response = await fetch(path, { headers: { accept: "application/json" }, cache: "no-store" });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }

  // Every change is a POST of JSON with the session's token: a cross-site form can send
  // neither.
  async function act(action) {
    const response = await fetch("api/action", {
      method: "POST",
      headers: { "content-type": "application/json", "x-outbox-console": session.token },
      body: JSON.stringify(action),
      cache: "no-store",
    });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }

  function can(action) {
    return session && !session.read_only && session.access.act[action] === true;
  }

  function when(value) {
    if (!value) return "";
    const date = new Date(value);
    return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "";
    if (seconds < 1) return (seconds * 1000).toFixed(0) + " ms";
    if (seconds < 120) return seconds.toFixed(1) + " s";
    if (seconds < 7200) return (seconds / 60).toFixed(1) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  // A button that acts: each carries data-action, so what a role may do is easy to see.
  function button(label, handler, className) {
    return el("button", { type: "button", class: className || null, "data-action": true, onclick: handler }, label);
  }

  // Asks in a dialog; resolves true when confirmed.
  function confirmDialog(text) {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-text").textContent = text;
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
      dialog.returnValue = "cancel";
      dialog.showModal();
    });
  }

  async function run(action, done, question) {
    if (question && !(await confirmDialog(question))) return;
    try {
      const result = await act(action);
      await route();
      show(done(result));
    } catch (error) {
      show(error.message, true);
    }
  }

  // What a view says when the role may not read what it shows.
  function refused(view, what) {
    view.append(el("p", {}, "The console's role (" + session.access.role + ") may not " + what + "."));
    return view;
  }

  // ---- Overview ----

  async function overview() {
    const view = el("div", { id: "overview" });
    const read = session.access.read;
    const [endpoints, activity, relays] = await Promise.all([
      read.endpoints ? get("api/endpoints") : null,
      read.events ? get("api/activity") : null,
      read.relays ? get("api/relays") : null,
    ]);
    if (!endpoints && !activity && !relays) {
      view.append(el("p", {}, "The console's role (" + session.access.role + ") may read none of the outbox's numbers."));
      return view;
    }
    const minutes = new Map();
    for (const m of activity ? activity.minutes : []) {
      if (!minutes.has(m.endpoint)) minutes.set(m.endpoint, []);
      minutes.get(m.endpoint).push(m);
    }
    if (endpoints) {
      view.append(el("h2", {}, "Endpoints"));
      const rows = endpoints.map((e) => {
        const hour = minutes.get(e.name) || [];
        const sent = hour.reduce((n, m) => n + m.sent, 0);
        const failed = hour.reduce((n, m) => n + m.failed, 0);
        const rate = sent + failed > 0 ? ((100 * sent) / (sent + failed)).toFixed(1) + "%" : "";
        const state = e.disabled_at ? el("span", { class: "bad" }, "disabled: " + (e.disabled_reason || ""))
          : e.failing_since ? el("span", { class: "warn" }, "failing since " + when(e.failing_since))
          : el("span", { class: "good" }, "healthy");
        return el("tr", { "data-endpoint": e.name },
          el("td", {}, el("a", { href: "#/events?endpoint=" + encodeURIComponent(e.name) }, e.name), el("div", { class: "muted" }, e.kind)),
          el("td", { class: "number", "data-field": "pending" }, e.pending),
          el("td", { class: "number", "data-field": "waiting" }, e.waiting),
          el("td", { class: "number", "data-field": "dead" },
            e.dead > 0 ? el("a", { class: "bad", href: "#/events?state=dead&endpoint=" + encodeURIComponent(e.name) }, String(e.dead)) : "0"),
          el("td", { class: "number", "data-field": "oldest_pending" }, age(e.oldest_pending_seconds)),
          el("td", { class: "number", "data-field": "blocked_keys" }, e.blocked_keys),
          el("td", { "data-field": "state" }, state, e.last_error ? el("div", { class: "muted" }, e.last_error) : null),
          el("td", { class: "number", "data-field": "success_rate" }, rate),
          el("td", { "data-field": "per_minute" }, chart(hour), el("div", { class: "muted" }, sent + " sent, " + failed + " failed in the last hour")));
      });
      view.append(el("table", {},
        el("thead", {}, el("tr", {}, ["endpoint", "pending", "waiting", "dead", "oldest pending", "blocked keys", "health", "success (1 h)", "per minute (1 h)"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)));
    }
    if (relays) {
      view.append(el("h2", {}, "Relays"));
      const alive = relays.processes.map((r) => el("li", {}, "outbox relay " + r.host + " pid " + r.pid + " (" + r.version + "), seen " + when(r.seen_at)))
        .concat(relays.workers.map((w) => el("li", {}, "worker " + w.worker + " pid " + w.pid + ": " + w.in_flight + " in flight, " + w.delivered + " delivered, " + w.failed + " failed")));
      view.append(alive.length ? el("ul", { id: "relays" }, alive) : el("p", { id: "relays", class: "bad" }, "No relay is running: nothing is being delivered."));
    }
    if (activity) {
      view.append(el("h2", {}, "Pull consumers holding leases"));
      view.append(activity.consumers.length
        ? el("ul", { id: "consumers" }, activity.consumers.map((c) => el("li", {}, c.endpoint + ": session " + c.session + " holds " + c.leases + " until " + when(c.until))))
        : el("p", { id: "consumers", class: "muted" }, "None right now."));
    }
    return view;
  }

  // Deliveries sent (green) and failed (red) per minute over the last hour, as bars.
  function chart(minutes) {
    const svg = "http://www.w3.org/2000/svg";
    const width = 180, height = 32;
    const node = document.createElementNS(svg, "svg");
    node.setAttribute("class", "chart");
    node.setAttribute("width", width);
    node.setAttribute("height", height);
    const top = Math.max(1, ...minutes.map((m) => m.sent + m.failed));
    const now = Date.now();
    for (const m of minutes) {
      const ago = (now - new Date(m.minute).getTime()) / 60000;
      const x = width - 3 * (Math.floor(ago) + 1);
      if (x < 0) continue;
      let y = height;
      for (const [kind, n] of [["sent", m.sent], ["failed", m.failed]]) {
        const h = (n / top) * height;
        const rect = document.createElementNS(svg, "rect");
        rect.setAttribute("class", kind);
        rect.setAttribute("x", x);
        rect.setAttribute("y", y - h);
        rect.setAttribute("width", 2);
        rect.setAttribute("height", h);
        node.append(rect);
        y -= h;
      }
    }
    return node;
  }

  // ---- Events ----

  const FILTERS = [["state", "state"], ["endpoint", "endpoint"], ["topic", "topic (order.*)"], ["key", "key"], ["id", "event id"],
    ["since", "created since"], ["until", "created until"], ["path", "JSON path ($.customer ? (@ == \"c-1\"))"]];

  async function events(query) {
    const view = el("div", { id: "events", "data-query": query });
    if (!session.access.read.events) return refused(view, "read events");
    const params = new URLSearchParams(query);
    const form = el("form", { class: "filter", onsubmit: (e) => {
      e.preventDefault();
      const next = new URLSearchParams();
      for (const [name, value] of new FormData(form)) if (value) next.set(name, value);
      location.hash = "#/events?" + next.toString();
    } });
    for (const [name, label] of FILTERS) {
      const input = name === "state"
        ? el("select", { name }, ["", "pending", "waiting", "dead", "sent"].map((s) => el("option", { value: s, selected: params.get(name) === s }, s || "any")))
        : el("input", { name, value: params.get(name) || "" });
      form.append(el("label", {}, label, input));
    }
    form.append(el("button", { type: "submit", class: "primary" }, "Search"));
    view.append(form);

    const filter = new URLSearchParams(params);
    filter.delete("after");
    const [page, count] = await Promise.all([get("api/events?" + params.toString()), get("api/count?" + filter.toString()).catch(() => null)]);
    view.append(el("p", { id: "count", class: "muted" },
      count === null ? "Counting took too long."
        : count.more ? "More than " + count.count.toLocaleString("en") + " deliveries match" +
          (count.estimate ? " (about " + count.estimate.toLocaleString("en") + ", the planner's estimate)." : ".")
        : count.count + " deliveries match."));

    const selected = new Set();
    const operations = [["requeue", "Requeue"], ["skip", "Skip"]].filter(([op]) => can(op));
    if (operations.length) {
      const bar = el("div", { class: "actions" });
      for (const [op, label] of operations) {
        bar.append(button(label + " selected", () => {
          const items = [...selected].map((s) => JSON.parse(s));
          if (!items.length) return show("Select deliveries first.", true);
          run({ action: "selection", operation: op, items }, (r) => label + ": " + r.changed + " of " + items.length + " changed.");
        }));
        bar.append(button(label + " all matching…", async () => {
          try {
            const exact = await get("api/count/exact?" + filter.toString());
            run({ action: "bulk", operation: op, filter: filter.toString() }, (r) => label + ": " + r.changed + " changed.",
              label + " all " + exact.count + " deliveries this filter matches?");
          } catch (error) {
            show(error.message, true);
          }
        }, op === "skip" ? "danger" : null));
      }
      view.append(bar);
    }

    const rows = page.rows.map((r) => {
      const key = JSON.stringify({ event_id: r.event_id, endpoint: r.endpoint });
      return el("tr", { "data-event": r.event_id, "data-endpoint": r.endpoint, "data-state": r.state },
        operations.length ? el("td", {}, el("input", { type: "checkbox", "aria-label": "select", onchange: (e) => e.target.checked ? selected.add(key) : selected.delete(key) })) : null,
        el("td", {}, el("a", { href: "#/event/" + r.event_id }, String(r.event_id))),
        el("td", {}, r.endpoint),
        el("td", {}, r.topic),
        el("td", {}, r.key || ""),
        el("td", { class: r.state === "dead" ? "bad" : r.state === "sent" ? "good" : "" }, r.state),
        el("td", { class: "number" }, r.attempts),
        el("td", {}, when(r.created_at)),
        el("td", {}, r.last_error || ""));
    });
    const headings = (operations.length ? [""] : []).concat(["event", "endpoint", "topic", "key", "state", "attempts", "created", "last error"]);
    view.append(el("table", {}, el("thead", {}, el("tr", {}, headings.map((h) => el("th", {}, h)))), el("tbody", {}, rows)));
    if (!page.rows.length) view.append(el("p", { class: "muted" }, "Nothing matches."));
    if (page.more) {
      const last = page.rows[page.rows.length - 1];
      const next = new URLSearchParams(filter);
      next.set("after", last.event_id + ":" + last.endpoint);
      view.append(el("p", {}, el("a", { id: "next", href: "#/events?" + next.toString() }, "Next page →")));
    }
    return view;
  }

  // ---- One event ----

  async function event(id) {
    const view = el("div", { id: "event" });
    const e = await get("api/event?id=" + encodeURIComponent(id));
    view.append(el("h2", {}, "Event " + e.id));
    view.append(el("table", {}, el("tbody", {},
      el("tr", {}, el("th", {}, "topic"), el("td", { id: "topic" }, e.topic)),
      el("tr", {}, el("th", {}, "key"), el("td", { id: "key" }, e.key || "")),
      el("tr", {}, el("th", {}, "created"), el("td", {}, when(e.created_at))))));
    view.append(el("h2", {}, "Payload"));
    view.append(el("pre", { id: "payload" }, JSON.stringify(e.payload, null, 2)));
    view.append(el("h2", {}, "Deliveries"));
    for (const d of e.deliveries) {
      const state = d.sent_at ? "sent " + when(d.sent_at) : d.dead_at ? "dead since " + when(d.dead_at) : d.leased ? "in flight, lease until " + when(d.available_at) : "next attempt " + when(d.available_at);
      const card = el("div", { class: "card", "data-endpoint": d.endpoint },
        el("strong", {}, d.endpoint), " ", el("span", { "data-field": "state", class: d.dead_at ? "bad" : d.sent_at ? "good" : "" }, state),
        el("div", {}, "attempts " + d.attempts + " (claim " + d.attempt + ")",
          d.position === null || d.position === undefined ? "" : d.position === 0 ? " · head of key " + d.key : " · " + d.position + " ahead of it in key " + d.key),
        d.last_error ? el("div", { class: "bad", "data-field": "last_error" }, d.last_error) : null);
      const bar = el("div", { class: "actions" });
      if (!d.sent_at && can("requeue")) {
        bar.append(button("Requeue", () => run({ action: "requeue", event_id: e.id, endpoint: d.endpoint }, (r) => "Requeued " + r.changed + ".")));
      }
      if (d.dead_at && can("skip")) {
        bar.append(button("Skip", () => run({ action: "skip", endpoint: d.endpoint, event_id: e.id }, (r) => r.changed ? "Skipped: its key goes on." : "It blocked nothing."), "danger"));
      }
      if (bar.childElementCount) card.append(bar);
      if (d.failures.length) {
        card.append(el("table", { class: "failures" },
          el("thead", {}, el("tr", {}, ["claim", "failed at", "status", "took", "error", "response (first kB)"].map((h) => el("th", {}, h)))),
          el("tbody", {}, d.failures.map((f) => el("tr", {},
            el("td", { class: "number" }, f.attempt), el("td", {}, when(f.failed_at)), el("td", {}, f.status === null ? "" : String(f.status)),
            el("td", { class: "number" }, f.duration_ms === null ? "" : f.duration_ms.toFixed(0) + " ms"), el("td", {}, f.error),
            el("td", {}, el("pre", {}, f.response || "")))))));
      }
      view.append(card);
    }
    if (!e.deliveries.length) view.append(el("p", { class: "muted" }, "No delivery: no endpoint was subscribed to its topic when it was enqueued."));
    return view;
  }

  // ---- Endpoints ----

  async function endpoints() {
    const view = el("div", { id: "endpoints" });
    if (!session.access.read.endpoints) return refused(view, "read endpoints");
    const list = await get("api/endpoints");
    for (const e of list) {
      const card = el("div", { class: "card", "data-endpoint": e.name },
        el("strong", {}, e.name), " ", el("span", { class: "muted" }, e.kind + (e.ordered ? ", ordered" : "") + ", topics " + e.topics.join(" ")),
        e.disabled_at ? el("div", { class: "bad", "data-field": "disabled" }, "disabled " + when(e.disabled_at) + ": " + (e.disabled_reason || "")) : null);
      const bar = el("div", { class: "actions" });
      if (e.disabled_at && can("enable")) bar.append(button("Enable", () => run({ action: "enable", name: e.name }, () => e.name + " enabled.")));
      if (!e.disabled_at && can("disable")) bar.append(button("Disable", () => run({ action: "disable", name: e.name, reason: "disabled in the console" }, () => e.name + " disabled.")));
      if (can("rotate") && e.kind === "webhook") bar.append(button("Rotate secret", () => rotate(e.name, card)));
      if (can("endpoint_set")) bar.append(button("Edit", () => card.append(endpointForm(e))));
      if (can("drop")) bar.append(button("Drop", () => run({ action: "drop", name: e.name }, () => e.name + " dropped.", "Drop endpoint " + e.name + " and all its deliveries?"), "danger"));
      if (bar.childElementCount) card.append(bar);
      if (can("replay")) {
        const replay = el("form", { class: "inline", onsubmit: (event) => {
          event.preventDefault();
          const data = new FormData(replay);
          run({ action: "replay", endpoint: e.name, since: data.get("since"), until: data.get("until") || null }, (r) => r.changed + " deliveries to " + e.name + " will be made again.");
        } }, el("label", {}, "replay since", el("input", { name: "since", required: true, placeholder: "2026-12-01 00:00Z" })),
        el("label", {}, "until (default: now)", el("input", { name: "until" })), el("button", { type: "submit", "data-action": true }, "Replay"));
        card.append(replay);
      }
      view.append(card);
    }
    if (can("endpoint_set")) {
      view.append(el("h2", {}, "New endpoint"));
      view.append(endpointForm(null));
    }
    return view;
  }

  // The new secret is shown here once: the database keeps it where no role can read it.
  async function rotate(name, card) {
    if (!(await confirmDialog("Rotate the signing secret of " + name + "? The old one keeps signing for 24 hours."))) return;
    try {
      const result = await act({ action: "rotate", name });
      card.append(el("div", { class: "secret", "data-field": "secret" }, result.secret),
        el("p", { class: "warn" }, "Copy it now: it is not shown again. Give it to the receiver before the old one expires."));
      show("New secret for " + name + " made.");
    } catch (error) {
      show(error.message, true);
    }
  }

  function endpointForm(existing) {
    const e = existing || { name: "", kind: "webhook", topics: ["*"], ordered: false };
    const form = el("form", { class: "inline endpoint-form", onsubmit: (event) => {
      event.preventDefault();
      const data = new FormData(form);
      let headers = {};
      try {
        headers = data.get("headers") ? JSON.parse(data.get("headers")) : {};
      } catch (error) {
        return show("headers: not a JSON object: " + error.message, true);
      }
      const number = (name) => (data.get(name) ? Number(data.get(name)) : null);
      run({
        action: "endpoint_set", name: data.get("name"), url: data.get("url") || null,
        topics: data.get("topics").split(/[\s,]+/).filter(Boolean), kind: data.get("kind"), headers,
        timeout: data.get("timeout") || null, max_attempts: number("max_attempts"), max_in_flight: number("max_in_flight"),
        ordered: data.get("ordered") === "on",
      }, () => "Endpoint " + data.get("name") + " saved.");
    } },
    el("label", {}, "name", el("input", { name: "name", value: e.name, required: true, readonly: existing ? true : null })),
    el("label", {}, "kind", el("select", { name: "kind" }, ["webhook", "pull"].map((k) => el("option", { value: k, selected: e.kind === k }, k)))),
    el("label", {}, existing ? "URL (enter it again: it is not shown, it may carry credentials)" : "URL", el("input", { name: "url", size: 40 })),
    el("label", {}, "topics", el("input", { name: "topics", value: e.topics.join(" ") })),
    el("label", {}, "headers (JSON)", el("input", { name: "headers", placeholder: "{}" })),
    el("label", {}, "timeout", el("input", { name: "timeout", size: 6, value: e.timeout || "" })),
    el("label", {}, "max attempts", el("input", { name: "max_attempts", size: 4, value: e.max_attempts || "" })),
    el("label", {}, "max in flight", el("input", { name: "max_in_flight", size: 4, value: e.max_in_flight || "" })),
    el("label", {}, "ordered", el("input", { name: "ordered", type: "checkbox", checked: e.ordered })),
    el("button", { type: "submit", class: "primary", "data-action": true }, existing ? "Save" : "Create"));
    return form;
  }

  // ---- Leases ----

  async function leases() {
    const view = el("div", { id: "leases" });
    if (!session.access.read.leases) return refused(view, "see pull consumers' leases");
    const list = await get("api/leases");
    if (!list.length) view.append(el("p", { class: "muted" }, "No lease is held on the pull endpoints this role may consume."));
    for (const l of list) {
      const row = el("div", { class: "card", "data-endpoint": l.endpoint, "data-event": l.event_id },
        el("strong", {}, l.endpoint + " · event " + l.event_id), " ", el("span", { class: "muted" }, l.topic + ", claim " + l.attempt + ", leased until " + when(l.leased_until)));
      const bar = el("div", { class: "actions" });
      if (can("extend")) bar.append(button("Extend 5 min", () => run({ action: "extend", endpoint: l.endpoint, event_id: l.event_id, attempt: l.attempt, lease: "5 minutes" }, (r) => r.changed ? "Lease extended." : "The claim is no longer current.")));
      if (can("nack")) bar.append(button("Nack", () => run({ action: "nack", endpoint: l.endpoint, event_id: l.event_id, attempt: l.attempt, error: "nacked in the console" }, (r) => r.changed ? "Nacked: it will be retried." : "The claim is no longer current."), "danger"));
      if (bar.childElementCount) row.append(bar);
      view.append(row);
    }
    return view;
  }

  // ---- Routing ----

  async function route() {
    clearTimeout(refreshTimer);
    const hash = location.hash || "#/overview";
    const [path, query] = hash.slice(1).split("?");
    for (const link of document.querySelectorAll("nav a")) link.classList.toggle("current", path.startsWith("/" + link.dataset.page));
    let view;
    try {
      if (path.startsWith("/event/")) view = await event(path.slice("/event/".length));
      else if (path === "/events") view = await events(query || "");
      else if (path === "/endpoints") view = await endpoints();
      else if (path === "/leases") view = await leases();
      else view = await overview();
    } catch (error) {
      view = el("p", { class: "bad" }, error.message);
    }
    main.replaceChildren(view);
    if (path === "/overview" || path === "/") scheduleRefresh();
  }

  // The overview refreshes every 5 s while the tab is shown, and not at all while it is hidden.
  function scheduleRefresh() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(() => {
      if (!document.hidden) route();
    }, 5000);
  }

  document.addEventListener("visibilitychange", () => {
    const path = (location.hash || "#/overview").slice(1).split("?")[0];
    if (!document.hidden && (path === "/overview" || path === "/")) route();
    else clearTimeout(refreshTimer);
  });

  window.addEventListener("hashchange", () => {
    clearNotice();
    route();
  });

  (async function start() {
    try {
      session = await get("api/session");
    } catch (error) {
      main.replaceChildren(el("p", { class: "bad" }, "The console cannot reach the outbox: " + error.message));
      return;
    }
    document.getElementById("who").textContent = "as " + session.access.role + (session.read_only ? " · read-only" : "");
    route();
  })();
})();
