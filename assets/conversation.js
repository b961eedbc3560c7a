// The conversation box's browser half (js_on_load of its gr.HTML): the box follows the stream, so
// the tokens being highlighted stay in view, unless the reader scrolls up to read, and follows
// again once they scroll back to the end. window.slFollow(fresh) is called after every change
// (a streamed delta, a full rendering); `fresh`: a new reply starts, follow it from its start.
const box = () => document.getElementById("sl-conversation");
let following = true;
const atEnd = (b) => b.scrollHeight - b.scrollTop - b.clientHeight < 24;
const listen = () => {
  const b = box();
  if (b && !b.slListening) {
    b.addEventListener("scroll", () => { following = atEnd(b); }, { passive: true });
    b.slListening = true;
  }
};
window.slFollow = (fresh) => {
  const b = box();
  if (!b) return;
  listen();
  if (fresh) following = true;
  if (following) b.scrollTop = b.scrollHeight;
};
watch("value", () => {  // a new prompt, or a reply not begun yet, starts following again
  const reply = document.querySelector("#sl-conversation .sl-reply[data-pieces]");
  window.slFollow(!reply || reply.getAttribute("data-pieces") === "0");
});
listen();
