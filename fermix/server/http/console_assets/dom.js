// Building the DOM from values as text only (W2): every value a page shows goes in through
// a text node or textContent, never parsed as HTML, so a stored "<img onerror=...>" is letters.

const FORBIDDEN = /^(on|style$|srcdoc$)/i;

/** An element with attributes and children; a string child becomes a text node. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (FORBIDDEN.test(name)) throw new Error(`attribute ${name} is not set from values`);
    node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Empty ``node`` and put ``children`` in it. */
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

/** A button that runs ``action`` on click (keyboard: Enter and Space, as any button). */
export function button(label, action, attrs = {}) {
  const b = el("button", { type: "button", ...attrs }, label);
  b.addEventListener("click", action);
  return b;
}

/** A labelled control: ``<div class=field><label for=id>label</label>control</div>``. */
export function field(label, control) {
  return el("div", { class: "field" }, el("label", { for: control.id }, label), control);
}

/** A <select> of ``options`` ([value, text] pairs or strings). */
export function select(id, options, chosen) {
  const s = el("select", { id, name: id });
  for (const option of options) {
    const [value, text] = Array.isArray(option) ? option : [option, option];
    const o = el("option", { value }, text);
    if (value === chosen) o.selected = true;
    s.append(o);
  }
  return s;
}

/** A table of ``rows``, each a list of cells (text or nodes), under ``headers``. */
export function table(caption, headers, rows) {
  return el(
    "div",
    { class: "table-wrap" },
    el(
      "table",
      {},
      el("caption", { class: "muted" }, caption),
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c))))),
    ),
  );
}

/** Epoch milliseconds as local date and time (empty for none). */
export function when(ms) {
  return ms ? new Date(ms).toLocaleString() : "";
}

/** An owner id as shown: the agent's shared files and rows have the empty owner. */
export function ownerLabel(owner) {
  return owner === "" ? "(shared by the agent)" : owner;
}
