// The one dialog shell (base.html): buttons hx-get a fragment into #dialog-content and we open the
// <dialog>; a response carrying the closeDialog trigger, a [data-close-dialog] button or Escape closes
// it. A closed dialog forgets what it showed, so an issued token does not linger in the page.
(function () {
  "use strict";
  const dialog = () => document.getElementById("dialog");
  const content = () => document.getElementById("dialog-content");

  function closeDialog() {
    const shell = dialog();
    if (!shell) return;
    content().innerHTML = "";
    if (shell.open) shell.close();
  }

  document.addEventListener("htmx:afterSwap", (event) => {
    const shell = dialog();
    if (event.detail.target.id !== "dialog-content" || !shell) return;
    if (!content().innerHTML.trim()) { closeDialog(); return; }
    if (!shell.open) shell.showModal();
    const first = content().querySelector(".invalid input, .invalid select, .invalid textarea")
      || content().querySelector("[autofocus], input:not([type=hidden]), select, textarea, button.primary");
    if (first) first.focus();
  });

  // A signed-out session answers a dialog request with a redirect to the login page: go there as a
  // whole page instead of squeezing the login page into the dialog.
  document.addEventListener("htmx:beforeSwap", (event) => {
    const xhr = event.detail.xhr;
    const login = (dialog() && dialog().dataset.loginUrl) || "/login/";
    if (xhr && xhr.responseURL && new URL(xhr.responseURL).pathname === login) {
      event.detail.shouldSwap = false;
      window.location.href = xhr.responseURL;
    }
  });

  // An error answer (403 after a role change, 500) would otherwise do nothing visible.
  document.addEventListener("htmx:responseError", (event) => {
    const shell = dialog();
    if (!shell) return;
    const status = event.detail.xhr ? event.detail.xhr.status : "?";
    const box = document.createElement("p");
    box.className = "errors";
    box.setAttribute("role", "alert");
    box.textContent = (shell.dataset.error || "Error {status}").replace("{status}", status);
    if (event.detail.target && event.detail.target.id === "dialog-content" && shell.open) {
      const old = content().querySelector("p.errors[role=alert].request-error");
      if (old) old.remove();
      box.classList.add("request-error");
      content().prepend(box);
    } else {
      const footer = document.createElement("footer");
      const close = document.createElement("button");
      close.type = "button";
      close.dataset.closeDialog = "";
      close.textContent = shell.dataset.closeLabel || "×";
      footer.append(close);
      content().replaceChildren(box, footer);
      if (!shell.open) shell.showModal();
    }
  });

  // HX-Trigger events are dispatched on the requesting element and bubble up to the document.
  document.addEventListener("closeDialog", closeDialog);

  document.addEventListener("click", (event) => {
    const closer = event.target.closest("[data-close-dialog]");
    if (closer && dialog() && dialog().contains(closer)) { closeDialog(); return; }
    const copy = event.target.closest("[data-copy]");
    if (copy) {
      const source = document.querySelector(copy.dataset.copy);
      if (!source) return;
      const text = source.textContent.trim();
      const done = () => { copy.textContent = copy.dataset.copied || "✓"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, () => selectText(source));
      } else {
        selectText(source);  // plain http: let the user press Ctrl+C on the selected token
      }
    }
  });

  function selectText(element) {
    const range = document.createRange();
    range.selectNodeContents(element);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  // <select data-autosubmit> (project switcher, language): choosing is submitting.
  document.addEventListener("change", (event) => {
    const select = event.target.closest("[data-autosubmit]");
    if (select && select.form) select.form.submit();
  });

  // Escape or the browser closing the dialog: forget the content too ("close" does not bubble).
  document.addEventListener("close", (event) => {
    if (event.target === dialog()) content().innerHTML = "";
  }, true);

  // A page restored from the back/forward cache must not show a dialog (or a token) from before.
  window.addEventListener("pageshow", (event) => { if (event.persisted) closeDialog(); });
})();
