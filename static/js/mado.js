// The one dialog shell: HTMX swaps a fragment into #dialog-content, we open it; a response
// carrying the closeDialog trigger (or a [data-close-dialog] button) closes it.
(function () {
  const dialog = () => document.getElementById("dialog");
  document.addEventListener("htmx:afterSwap", (event) => {
    if (event.detail.target.id === "dialog-content" && !dialog().open) dialog().showModal();
  });
  document.body.addEventListener("closeDialog", () => { if (dialog().open) dialog().close(); });
  document.addEventListener("click", (event) => {
    const closer = event.target.closest("[data-close-dialog]");
    if (closer && dialog().contains(closer)) { dialog().close(); return; }
    const copy = event.target.closest("[data-copy]");
    if (copy) {
      const text = document.querySelector(copy.dataset.copy).textContent.trim();
      navigator.clipboard.writeText(text).then(() => { copy.textContent = copy.dataset.copied || "✓"; });
    }
  });
  // A closed dialog forgets what it showed: an issued token must not linger in the page.
  document.addEventListener("close", (event) => {
    if (event.target.id === "dialog") document.getElementById("dialog-content").innerHTML = "";
  }, true);
})();
