// The streamed reply's browser half, run once by a hidden gr.HTML (js_on_load: `element`, `props`
// and `watch` are Gradio's). While a reply streams, the server sends only what each step added
// (demo/ui/html/render.py render_delta), not the whole conversation: the tokens are appended to the
// latest reply where it holds as many as the delta starts from. A delta that does not fit (another
// reply's, or one after a missed one) is left out: the reply's full rendering at its end puts the
// page right. The conversation box then follows the stream (window.slFollow, conversation.js).
watch("value", () => {
  const holder = document.createElement("template");
  holder.innerHTML = props.value || "";
  const delta = holder.content.querySelector(".sl-delta");
  const reply = document.querySelector("#sl-conversation .sl-reply[data-pieces]");
  if (!delta || !reply) return;
  if (reply.getAttribute("data-pieces") !== delta.getAttribute("data-from")) return;
  reply.insertAdjacentHTML("beforeend", delta.innerHTML);
  reply.setAttribute("data-pieces", delta.getAttribute("data-to"));
  if (window.slFollow) window.slFollow(delta.getAttribute("data-from") === "0");
});
