// Small behaviour of the Computers dialogs that HTMX cannot express (DESIGN §10: no JS framework).
// - GPUs (detected) checkboxes fill GPU IDs (one per line); Concurrent jobs follows the number of GPU
//   IDs until the user changes it ([data-follow-gpus] is dropped on the first edit).
// - Edit computer's tabs Connection / Settings after connecting (without JS both panels show).
// - The notice that Check again saves unsaved connection changes first.
(function () {
  "use strict";

  function gpuIds(form) {
    const area = form.querySelector('textarea[name="gpu_ids"]');
    return area ? area.value.split(/\s+/).filter(Boolean) : [];
  }

  function followGpus(form) {
    const concurrency = form.querySelector('input[name="concurrency"][data-follow-gpus]');
    if (concurrency) concurrency.value = String(Math.max(1, gpuIds(form).length));
  }

  document.addEventListener("change", (event) => {
    const box = event.target.closest('input[name="gpu_detected"]');
    if (!box || !box.form) return;
    const form = box.form;
    const area = form.querySelector('textarea[name="gpu_ids"]');
    if (area) {
      const checked = Array.from(form.querySelectorAll('input[name="gpu_detected"]:checked')).map((b) => b.value);
      area.value = checked.join("\n");
    }
    followGpus(form);
  });

  document.addEventListener("input", (event) => {
    const target = event.target;
    if (!target.form) return;
    if (target.matches('input[name="concurrency"]')) {
      delete target.dataset.followGpus;  // changed by hand: stop following
    } else if (target.matches('textarea[name="gpu_ids"]')) {
      followGpus(target.form);
    }
    if (target.closest("[data-connection-fields]")) {
      const notice = target.form.querySelector("[data-unsaved-notice]");
      if (notice) notice.hidden = false;
    }
  });

  function showTab(container, name) {
    container.querySelectorAll("[data-tab-panel]").forEach((panel) => {
      panel.hidden = panel.dataset.tabPanel !== name;
    });
    container.querySelectorAll("[data-tab]").forEach((tab) => {
      tab.setAttribute("aria-selected", tab.dataset.tab === name ? "true" : "false");
    });
    const input = container.querySelector('input[name="tab"]');
    if (input) input.value = name;
  }

  function setUp(root) {
    if (!root || !root.querySelectorAll) return;
    const containers = root.matches && root.matches("[data-tabs]") ? [root] : [];
    containers.push(...root.querySelectorAll("[data-tabs]"));
    containers.forEach((container) => {
      const input = container.querySelector('input[name="tab"]');
      showTab(container, (input && input.value) || "connection");
    });
  }

  document.addEventListener("click", (event) => {
    const tab = event.target.closest("[data-tab]");
    if (!tab) return;
    const container = tab.closest("[data-tabs]");
    if (!container) return;
    event.preventDefault();
    showTab(container, tab.dataset.tab);
  });

  document.addEventListener("htmx:load", (event) => setUp(event.detail.elt));

  // A dialog re-drawn with a check in progress or its result: bring that into view (the shell focuses
  // the first field, which may be far above it).
  document.addEventListener("htmx:afterSwap", (event) => {
    if (!event.detail.target || event.detail.target.id !== "dialog-content") return;
    const status = event.detail.target.querySelector("#check-progress, #check-result");
    if (status) status.scrollIntoView({block: "nearest"});
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", () => setUp(document));
  } else {
    setUp(document);
  }
})();
