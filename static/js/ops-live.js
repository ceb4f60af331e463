// Live node state for the operators' pages (no framework; htmx does the fetching).
// An element with data-ops-live="/ws/nodes/…" follows that websocket:
// - on the node list (data-ops-list): a node's event re-fetches that node's row; an event of a
//   node not shown (new, or now matching the filters) re-fetches the table, as a reconnection
//   does (whatever happened while the socket was down);
// - on a node's page (data-ops-node): its events re-fetch the summary, the event list, the
//   leases and, when the state changed, the actions.
// The socket is live.js's `followSocket` (reconnects with backoff); <body data-ops-live> says
// "open" or "reconnecting".
// Forms with data-confirm ask before they submit.
(function () {
  "use strict";

  // htmx.ajax from `target` itself: htmx keeps one request per source element (a later one
  // replaces a queued one), so requests from one shared source would drop each other.
  function load(url, target, swap) {
    htmx.ajax("GET", url, { source: target, target: target, swap: swap || "innerHTML" });
  }

  function throttled(fn, ms) {
    let timer = null;
    return () => {
      if (timer) return;
      timer = setTimeout(() => {
        timer = null;
        fn();
      }, ms);
    };
  }

  function listPage(element) {
    const refreshTable = throttled(() => {
      load(location.pathname + location.search, "#node-table");
    }, 300);
    // One row fetch per node at a time; an event during it fetches once more after it, so the
    // row always ends as the newest state (htmx would drop a request queued on a row that the
    // fetch in flight then replaces).
    const fetching = new Map(); // node id → another event came meanwhile
    function refreshRow(id) {
      if (fetching.has(id)) {
        fetching.set(id, true);
        return;
      }
      fetching.set(id, false);
      fetch(`/console/nodes/${id}/row`, { credentials: "same-origin" })
        .then((response) => (response.ok ? response.text() : null))
        .then((html) => {
          const row = document.getElementById(`node-${id}`);
          if (html === null || !row) return;
          row.outerHTML = html;
          const fresh = document.getElementById(`node-${id}`);
          if (fresh) htmx.process(fresh);
        })
        .finally(() => {
          const again = fetching.get(id);
          fetching.delete(id);
          if (again) refreshRow(id);
        });
    }
    return {
      reconnected: refreshTable,
      event(data) {
        if (document.getElementById(`node-${data.node}`)) refreshRow(data.node);
        else refreshTable();
      },
    };
  }

  function nodePage(element) {
    const base = `/console/nodes/${element.dataset.opsNode}`;
    function refresh(state) {
      load(`${base}?part=summary`, "#node-summary");
      load(`${base}/events`, "#node-events");
      const actions = document.querySelector("[data-actions-state]");
      if (!actions || actions.dataset.actionsState !== state) {
        load(`${base}?part=actions`, "#node-actions");
      }
      document.body.dispatchEvent(new CustomEvent("node-changed"));
    }
    return { reconnected: () => refresh(""), event: (data) => refresh(data.state) };
  }

  function follow(element) {
    const page = "opsNode" in element.dataset ? nodePage(element) : listPage(element);
    const status = element.querySelector("[data-live-status]");
    window.followSocket(element.dataset.opsLive, {
      opened(first) {
        if (!first) page.reconnected();
      },
      message: (message) => page.event(JSON.parse(message.data)),
      show(state, text) {
        document.body.dataset.opsLive = state;
        if (status) status.textContent = text || "Live: node changes appear here as they happen.";
      },
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-ops-live]").forEach(follow);
    document.body.addEventListener("submit", (event) => {
      const form = event.target;
      if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
        event.preventDefault();
      }
    });
  });
})();
