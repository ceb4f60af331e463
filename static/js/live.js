// Live updates for console pages (no framework): an element with data-live-socket="/ws/…/"
// follows that websocket. Every event, and every (re)connection, fires "live-event" on <body>;
// htmx elements listening for it (hx-trigger="live-event from:body") fetch what changed. A
// dropped socket reconnects with backoff, and since a reconnection fires "live-event" too, a
// timeline fetches the events it missed: it asks for those after its last one (?after=<id>).
// A socket the server refuses is not retried for ever.
(function () {
  "use strict";

  const REFUSED_HANDSHAKES = 4; // ~4 s of backoff: a blip passes, a refusal does not loop

  function fire() {
    document.body.dispatchEvent(new CustomEvent("live-event"));
  }

  // Whether a server is there when a handshake failed: the browser shows a refused handshake
  // (a foreign origin, a path with no route, a proxy that does not pass websockets) and a server
  // that is down alike, as code 1006, so ask the page itself over HTTP. Any answer below 500 (a
  // redirect to sign-in included) means a server is there; no answer or a 5xx (a proxy whose
  // upstream is down) means try again.
  async function serverAnswers() {
    try {
      const response = await fetch(location.href, {
        method: "HEAD",
        cache: "no-store",
        credentials: "same-origin",
        redirect: "manual",
      });
      return response.type === "opaqueredirect" || response.status < 500;
    } catch {
      return false;
    }
  }

  // The one reconnecting websocket of the console (ops-live.js uses it too): `path` is
  // "/ws/…/"; `opened(first)` runs on every (re)connection, `message(event)` on each message,
  // `show(state, text)` when the connection's state changes. A dropped socket reconnects with
  // backoff 0.5 s → 5 s. A refusal is final: a close with 4401 (not signed in) or 4403 (not
  // allowed; the consumers accept and close at once to say so), or REFUSED_HANDSHAKES failed
  // handshakes in a row while the server still answers over HTTP (see serverAnswers). A single
  // failed handshake is retried: under load or in a Redis blip one may time out.
  window.followSocket = function (path, { opened, message, show }) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}${path}`;
    let delay = 500;
    let first = true;
    let failedHandshakes = 0; // in a row, with the server answering

    function refused() {
      show("refused", "Live updates are not available for this page (reload to try again).");
    }

    function retry() {
      show("reconnecting", "Connection lost; reconnecting…");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 5000);
    }

    function connect() {
      const socket = new WebSocket(url);
      let accepted = false;
      socket.onopen = () => {
        accepted = true;
        delay = 500;
        failedHandshakes = 0;
        show("open");
        opened(first);
        first = false;
      };
      socket.onmessage = message;
      socket.onclose = (event) => {
        if (event.code === 4401 || event.code === 4403) refused();
        else if (accepted) retry();
        else
          serverAnswers().then((answers) => {
            failedHandshakes = answers ? failedHandshakes + 1 : 0;
            if (failedHandshakes >= REFUSED_HANDSHAKES) refused();
            else retry();
          });
      };
    }
    connect();
  };

  function follow(element) {
    const status = element.querySelector("[data-live-status]");
    window.followSocket(element.dataset.liveSocket, {
      opened: fire, // whatever happened while we were away
      message: fire,
      show(state, text) {
        element.dataset.liveState = state;
        if (status) status.textContent = text || "Live";
      },
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-live-socket]").forEach(follow);

    // A list with data-cursor asks only for entries after its last one.
    document.body.addEventListener("htmx:configRequest", (event) => {
      const list = event.detail.elt;
      if (list.dataset && "cursor" in list.dataset) {
        const items = list.querySelectorAll("[data-event]");
        event.detail.parameters.after = items.length ? items[items.length - 1].dataset.event : 0;
      }
    });
    // Two fetches that crossed may bring the same entry: keep the first.
    document.body.addEventListener("htmx:afterSwap", (event) => {
      const list = event.detail.target;
      if (!list.dataset || !("cursor" in list.dataset)) return;
      const seen = new Set();
      list.querySelectorAll("[data-event]").forEach((item) => {
        if (seen.has(item.dataset.event)) item.remove();
        else seen.add(item.dataset.event);
      });
    });
  });
})();
