// The step inspector's browser half, run once by the inspector's gr.HTML (js_on_load: `element`,
// `trigger` and `watch` are Gradio's). A click or a tap on a token of the latest reply, on a struck
// rejected draft, or on a step button of the inspector sends that step (data-step) to the Python
// listener, which answers with the step's HTML and moves the tree view; -1 closes the inspector.
// One listener on the document, so it outlives every re-render of the streaming conversation.
// The tokens of the step shown are outlined (sl-picked), again after each re-render.
// From the keyboard the reply is one stop in the Tab order (a roving tabindex): the arrow keys move
// between its steps, Home and End to the first and last, Enter or Space opens the step focused.
const conversation = () => document.getElementById("sl-conversation");
const shownStep = () => {
  const panel = element.querySelector("[data-inspected]");
  return panel ? panel.getAttribute("data-inspected") : null;
};
let observed = null;
const mark = () => {
  const chat = conversation();
  if (!chat) return;
  if (chat !== observed) {  // re-mark after every re-render of the conversation
    new MutationObserver(mark).observe(chat, { childList: true, subtree: true });
    observed = chat;
  }
  const step = shownStep();
  chat.querySelectorAll(".sl-picked").forEach((e) => e.classList.remove("sl-picked"));
  if (step !== null) chat.querySelectorAll('[data-step="' + step + '"]').forEach((e) => e.classList.add("sl-picked"));
  rove(chat, step);
};
// The one token the Tab key reaches: the one that had it, else the first of the step shown, else the first.
const rove = (chat, step) => {
  const items = [...chat.querySelectorAll("[data-step]")];
  if (!items.length) return;
  const keep = items.find((e) => e.getAttribute("tabindex") === "0");
  const want = keep || (step !== null && items.find((e) => e.getAttribute("data-step") === step)) || items[0];
  for (const e of items) {
    if (e.getAttribute("role") !== "button") e.setAttribute("role", "button");
    const index = e === want ? "0" : "-1";
    if (e.getAttribute("tabindex") !== index) e.setAttribute("tabindex", index);
  }
};
const move = (from, to) => {
  from.setAttribute("tabindex", "-1");
  to.setAttribute("tabindex", "0");
  to.focus();
};
let picked = false;
const pick = (event) => {
  const target = event.target instanceof Element ? event.target.closest("[data-step]") : null;
  if (!target || !target.closest("#sl-conversation, #sl-inspector")) return;
  const step = parseInt(target.getAttribute("data-step"), 10);
  if (Number.isNaN(step)) return;
  picked = true;
  trigger("click", { step: step });
};
const key = (event) => {
  const item = event.target instanceof Element ? event.target.closest("#sl-conversation [data-step]") : null;
  if (!item) return;
  if (event.key === "Enter" || event.key === " ") {
    event.preventDefault();
    picked = true;
    trigger("click", { step: parseInt(item.getAttribute("data-step"), 10) });
    return;
  }
  const items = [...conversation().querySelectorAll("[data-step]")];
  const steps = [...new Set(items.map((e) => e.getAttribute("data-step")))];
  const at = steps.indexOf(item.getAttribute("data-step"));
  const to = { ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0,
               End: steps.length - 1 }[event.key];
  if (to === undefined) return;
  event.preventDefault();
  const step = steps[Math.min(Math.max(to, 0), steps.length - 1)];
  move(item, items.find((e) => e.getAttribute("data-step") === step));
};
if (window.slInspectorPick) document.removeEventListener("click", window.slInspectorPick);
if (window.slInspectorKey) document.removeEventListener("keydown", window.slInspectorKey);
window.slInspectorPick = pick;
window.slInspectorKey = key;
document.addEventListener("click", pick);
document.addEventListener("keydown", key);
watch("value", () => {
  mark();
  if (picked && shownStep() !== null) {  // on a phone the inspector may be out of sight
    const box = element.getBoundingClientRect();
    if (box.top > window.innerHeight || box.bottom < 0) element.scrollIntoView({ block: "start", behavior: "smooth" });
  }
  picked = false;
});
mark();
