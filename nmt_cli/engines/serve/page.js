// nmt serve's page: translation as you type, n-best on demand, and the attention of the
// first sentence drawn by the attention viewer (/attention.js, NmtAttention) that
// `nmt attention`'s page uses. Only this server is ever called; nothing is evaluated from
// strings and no inline style is written, so it runs under default-src 'self'.
"use strict";

(() => {
  const DEBOUNCE_MS = 300;
  const UNIT = "SentencePiece pieces (▁ starts a word)";
  const $ = (id) => document.getElementById(id);
  const text = $("text"), results = $("results"), error = $("error");
  let typing = null; // the debounce timer
  let pending = null; // the AbortController of the request in flight
  let latest = 0; // the number of the newest request: older answers are dropped

  function element(tag, className, content) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (content !== undefined) node.textContent = content;
    return node;
  }

  // The server's message for a failed request: LibreTranslate-style {"error": ...},
  // Starlette's {"detail": ...}, or the status line when the body is not JSON.
  async function failure(response) {
    let message = response.statusText;
    try {
      const body = await response.json();
      message = body.error || body.detail || message;
    } catch (_) { /* not JSON: the status line says enough */ }
    return new Error(`${response.status}: ${typeof message === "string" ? message : JSON.stringify(message)}`);
  }

  async function post(path, body, signal) {
    const response = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal,
    });
    if (!response.ok) throw await failure(response);
    return response.json();
  }

  function score(value) {
    return typeof value === "number" ? value.toFixed(3) : "";
  }

  function showTranslations(translations, wantNbest) {
    results.replaceChildren(...translations.map((t) => {
      const box = element("div", "sentence");
      box.append(element("p", "translation", t.text));
      const meta = [`score ${score(t.score)}`];
      if (t.truncated) meta.push("the input was longer than the model takes and was cut");
      box.append(element("p", "meta", meta.join("; ")));
      if (wantNbest && Array.isArray(t.nbest) && t.nbest.length) {
        const list = element("ol", "nbest");
        list.setAttribute("aria-label", "alternatives, best first");
        t.nbest.forEach((alternative) => {
          const item = element("li", "", alternative.text);
          item.append(element("span", "score", score(alternative.score)));
          list.append(item);
        });
        box.append(list);
      }
      return box;
    }));
  }

  // The server's cross-attention as the viewer's data: weights are target rows x source
  // columns, of the decoder layer that aligns, averaged over its heads.
  function viewerData(attention) {
    const title = "encoder-decoder attention of the aligning layer, mean over heads";
    const layers = [[attention.weights]]; // one layer of one head
    return {
      unit: attention.unit || UNIT,
      kinds: {
        cross: { title, rows: attention.target, cols: attention.source, layers },
      },
    };
  }

  function showAttention(translation) {
    const view = $("attention-view");
    if (!translation || !translation.attention) {
      view.hidden = true;
      return;
    }
    $("alignment-pairs").textContent = translation.alignment
      ? `Hard alignment (source-target word positions): ${translation.alignment}`
      : "";
    NmtAttention.mount($("attention"), viewerData(translation.attention));
    view.hidden = false;
  }

  async function translate() {
    clearTimeout(typing);
    const lines = text.value.split("\n").map((line) => line.trim()).filter((line) => line);
    if (pending) pending.abort();
    const number = ++latest;
    error.textContent = "";
    if (!lines.length) {
      results.replaceChildren();
      showAttention(null);
      return;
    }
    const wantNbest = $("nbest").checked;
    const wantAttention = $("alignment").checked;
    const request = {
      text: lines.length === 1 ? lines[0] : lines,
      nbest: wantNbest ? Number($("nbest-count").value) : 1,
      alignment: wantAttention,
    };
    pending = new AbortController();
    results.setAttribute("aria-busy", "true");
    try {
      // The server draws attention for one sentence: the first, asked on its own.
      const answers = await Promise.all([
        post("/v1/translate", { ...request, attention: wantAttention && lines.length === 1 },
          pending.signal),
        wantAttention && lines.length > 1
          ? post("/v1/translate", { text: lines[0], alignment: true, attention: true },
            pending.signal)
          : null,
      ]);
      if (number !== latest) return;
      showTranslations(answers[0].translations, wantNbest);
      showAttention(wantAttention ? (answers[1] || answers[0]).translations[0] : null);
    } catch (failed) {
      if (failed.name === "AbortError" || number !== latest) return;
      error.textContent = `The server could not translate: ${failed.message}`;
    } finally {
      if (number === latest) results.setAttribute("aria-busy", "false");
    }
  }

  async function showPair() {
    const pair = $("pair");
    try {
      const response = await fetch("/languages");
      if (!response.ok) throw await failure(response);
      const languages = await response.json();
      const names = new Map(languages.map((l) => [l.code, l.name]));
      const pairs = languages.flatMap((l) => (l.targets || [])
        .filter((t) => t !== l.code)
        .map((t) => `${l.name} (${l.code}) → ${names.get(t) || t} (${t})`));
      pair.textContent = pairs.length ? `Model: ${pairs.join("; ")}` : "Model: languages unknown";
    } catch (failed) {
      pair.textContent = `The model's languages could not be read: ${failed.message}`;
    }
  }

  $("form").addEventListener("submit", (event) => {
    event.preventDefault();
    translate();
  });
  text.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(translate, DEBOUNCE_MS);
  });
  ["nbest", "nbest-count", "alignment"].forEach((id) => $(id).addEventListener("change", () => {
    if (text.value.trim()) translate();
  }));
  showPair();
})();
