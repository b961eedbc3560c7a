// The page's first Tab stop: a link past the settings sidebar (30-odd controls) to the prompt box,
// shown only while it has focus (assets/style.css .sl-skip). Run once by its gr.HTML (js_on_load).
element.querySelector("a").addEventListener("click", (event) => {
  event.preventDefault();
  const box = document.querySelector("#sl-prompt textarea");
  if (!box) return;
  box.scrollIntoView({ block: "center" });
  box.focus();
});
