// The step inspector's browser half, run once by the inspector's gr.HTML (js_on_load: `element`,
// `trigger` and `watch` are Gradio's). A click or a tap on a token of the latest reply, on a struck
// rejected draft, or on a step button of the inspector sends that step (data-step) to the Python
// listener, which answers with the step's HTML and moves the tree view; -1 closes the inspector.
// One listener on the document, so it outlives every re-render of the streaming conversation.
// The tokens of the step shown are outlined (sl-picked), again after each re-render.
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
if (window.slInspectorPick) document.removeEventListener("click", window.slInspectorPick);
window.slInspectorPick = pick;
document.addEventListener("click", pick);
watch("value", () => {
  mark();
  if (picked && shownStep() !== null) {  // on a phone the inspector may be out of sight
    const box = element.getBoundingClientRect();
    if (box.top > window.innerHeight || box.bottom < 0) element.scrollIntoView({ block: "start", behavior: "smooth" });
  }
  picked = false;
});
mark();
