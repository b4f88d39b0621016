// The attention viewer: one definition of how nmt draws attention in a browser.
// `nmt attention` inlines this file into its self-contained page; `nmt serve` sends it as
// /attention.js. Both call NmtAttention.mount(element, data) with the data that
// attention_html.page_data describes: {unit, kinds: {key: {title, rows, cols, layers}}},
// layers being (layer, head, row, column) weights, rows attending to columns.
// It writes no inline style markup and evaluates no strings, so it runs under a
// Content-Security-Policy of default-src 'self'.
"use strict";

const NmtAttention = (() => {
  const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const svgNs = "http://www.w3.org/2000/svg";

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // A labelled select; a choice of one is hidden, as there is nothing to choose.
  function control(name) {
    const label = element("label", "nmt-attention-control");
    const select = element("select");
    select.name = name;
    label.append(`${name} `, select);
    return { label, select };
  }

  function fill({ label, select }, items) {
    const keep = select.value;
    select.replaceChildren(...items.map(([value, text]) => {
      const option = element("option", "", text);
      option.value = value;
      return option;
    }));
    if (items.some(([value]) => value === keep)) select.value = keep;
    label.hidden = items.length < 2;
  }

  function heatmap({ kind, layer, heads }) {
    const n = heads.length;
    const table = element("table", "heat");
    const head = table.createTHead().insertRow();
    head.appendChild(element("th"));
    kind.cols.forEach((c) => head.appendChild(element("th", "", c)));
    const body = table.createTBody();
    kind.rows.forEach((r, i) => {
      const row = body.insertRow();
      row.appendChild(element("th", "", r));
      kind.cols.forEach((c, j) => {
        const w = heads.reduce((s, h) => s + layer[h][i][j], 0) / n;
        const cell = row.insertCell();
        cell.style.background = `rgba(8, 81, 156, ${w})`;
        cell.title = `${r} -> ${c}: ${w.toFixed(3)}`;
      });
    });
    return table;
  }

  function lines({ kind, layer, heads }, focus, setFocus) {
    const step = 22, width = 520, top = 10;
    const svg = document.createElementNS(svgNs, "svg");
    const height = top + step * Math.max(kind.rows.length, kind.cols.length);
    svg.setAttribute("width", width); svg.setAttribute("height", height);
    const x0 = 200, x1 = 320;
    heads.forEach((h) => {
      kind.rows.forEach((_, i) => {
        if (focus !== null && focus !== i) return;
        kind.cols.forEach((_, j) => {
          const w = layer[h][i][j];
          if (w < 0.01) return;
          const line = document.createElementNS(svgNs, "line");
          line.setAttribute("x1", x0); line.setAttribute("y1", top + i * step);
          line.setAttribute("x2", x1); line.setAttribute("y2", top + j * step);
          line.setAttribute("stroke", palette[h % palette.length]);
          line.setAttribute("stroke-opacity", w); line.setAttribute("stroke-width", 2);
          svg.appendChild(line);
        });
      });
    });
    const label = (text, x, y, anchor, i) => {
      const t = document.createElementNS(svgNs, "text");
      t.setAttribute("x", x); t.setAttribute("y", y + 4); t.setAttribute("text-anchor", anchor);
      t.textContent = text;
      if (i !== null) {
        if (focus === i) t.setAttribute("font-weight", "bold");
        t.addEventListener("click", () => setFocus(focus === i ? null : i));
      }
      svg.appendChild(t);
    };
    kind.rows.forEach((r, i) => label(r, x0 - 6, top + i * step, "end", i));
    kind.cols.forEach((c, j) => label(c, x1 + 6, top + j * step, "start", null));
    return svg;
  }

  // Draws `data` into `root` (its children are replaced): the controls (attention, layer,
  // head, view), a note saying what is shown, and the figure.
  function mount(root, data) {
    const kindControl = control("attention");
    const layerControl = control("layer");
    const headControl = control("head");
    const viewControl = control("view");
    fill(viewControl, [["heat", "heatmap"], ["lines", "lines"]]);
    const controls = element("div", "controls");
    controls.append(kindControl.label, layerControl.label, headControl.label, viewControl.label);
    const note = element("p", "note");
    const figure = element("div", "figure");
    root.classList.add("nmt-attention");
    root.replaceChildren(controls, note, figure);
    let focus = null;

    function current() {
      const kind = data.kinds[kindControl.select.value];
      const layer = kind.layers[Number(layerControl.select.value)];
      const head = headControl.select.value;
      return { kind, layer, heads: head === "all" ? layer.map((_, h) => h) : [Number(head)] };
    }

    function draw() {
      const state = current();
      const view = viewControl.select.value;
      const all = view === "heat" ? "mean over heads" : "all heads, one colour each";
      const head = headControl.select.value;
      const which = head === "all" ? all : `head ${Number(head) + 1}`;
      // A single layer or head (a server's summary of them) is not named.
      const heads = state.layer.length === 1 ? "" : `, ${which}`;
      const layerNumber = Number(layerControl.select.value) + 1;
      const layer = state.kind.layers.length === 1 ? "" : `, layer ${layerNumber}`;
      note.textContent = `${state.kind.title}${layer}${heads}. `
        + `Rows attend to columns. Tokens: ${data.unit}.`
        + (view === "lines" ? " Line opacity = weight; click a token to keep only its lines." : "");
      const setFocus = (i) => { focus = i; draw(); };
      figure.replaceChildren(view === "heat" ? heatmap(state) : lines(state, focus, setFocus));
    }

    function refresh() {
      const kind = data.kinds[kindControl.select.value];
      fill(layerControl, kind.layers.map((_, l) => [String(l), `${l + 1} of ${kind.layers.length}`]));
      const heads = kind.layers[0].map((_, h) => [String(h), String(h + 1)]);
      fill(headControl, heads.length === 1 ? [["0", "1"]] : [["all", "all"], ...heads]);
      focus = null;
      draw();
    }

    fill(kindControl, Object.entries(data.kinds).map(([key, kind]) => [key, kind.title]));
    kindControl.select.addEventListener("change", refresh);
    [layerControl, headControl, viewControl].forEach(({ select }) => {
      select.addEventListener("change", () => { focus = null; draw(); });
    });
    refresh();
  }

  return { mount };
})();
