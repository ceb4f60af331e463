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
    return {
      reconnected: refreshTable,
      event(data) {
        const row = document.getElementById(`node-${data.node}`);
        if (row) {
          load(`/console/nodes/${data.node}/row`, `#node-${data.node}`, "outerHTML");
        } else {
          refreshTable();
        }
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
