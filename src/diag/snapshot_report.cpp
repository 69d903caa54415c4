// Text, JSON and HTML views of a snapshot analysis. The HTML is one file with an inline SVG:
// no <script>, no external fonts or images, every snapshot-provided string escaped.
#include "diag/snapshot_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/bytes.h"

namespace vlac {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string pad_left(const std::string& s, size_t w) { return s.size() >= w ? s : std::string(w - s.size(), ' ') + s; }
std::string pad_right(const std::string& s, size_t w) { return s.size() >= w ? s : s + std::string(w - s.size(), ' '); }

std::string percent(uint64_t part, uint64_t whole) {
  return fmt("%.0f%%", whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
}

const char* shape_sentence(const std::string& shape) {
  if (shape == "staircase") return "STAIRCASE: memory grows every step and is never freed (a leak)";
  if (shape == "sawtooth") return "SAWTOOTH: per-step memory (activations) dominates the peak";
  if (shape == "flat") return "FLAT: memory alive all run (weights, optimizer state) dominates the peak";
  return "unknown: no allocation history recorded, only the state at the dump";
}

const char* part_meaning(int k) {
  switch (k) {
    case 0: return "alive all run: weights, optimizer state, inputs";
    case 1: return "freed within a step: activations, gradients, temporaries";
    default: return "kept every step, never freed";
  }
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') out += ' ';
        else out += c;
    }
  }
  return out;
}

std::string trace_line(const SnapshotAnalysis& a) {
  std::string s = std::to_string(a.n_events) + " events (" + std::to_string(a.n_allocs) + " allocs, " +
                  std::to_string(a.n_frees) + " frees), " + std::to_string(a.steps.size()) + " step" +
                  (a.steps.size() == 1 ? "" : "s") + " from " + a.step_source;
  if (a.first_time_us >= 0 && a.last_time_us >= a.first_time_us)
    s += ", " + format_duration(static_cast<double>(a.last_time_us - a.first_time_us) / 1e6);
  return s;
}

// Strings from the snapshot may be any bytes; JSON needs UTF-8. Invalid sequences -> U+FFFD.
std::string utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (size_t k = 1; ok && k < n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc >> 6) == 0x2;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    // reject overlong forms, surrogates and values past U+10FFFF
    if (ok && ((n == 2 && cp < 0x80) || (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
               (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))))
      ok = false;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

}  // namespace

std::string snapshot_text(const SnapshotAnalysis& a, const std::string& label) {
  std::string o;
  o += "snapshot: " + label + " (device " + std::to_string(a.device) + ", " + std::to_string(a.n_segments) + " segments)\n";
  if (a.has_trace) o += "trace: " + trace_line(a) + "\n";
  o += std::string("shape: ") + shape_sentence(a.shape) + "\n";
  if (a.has_trace) {
    o += "peak allocated " + format_bytes(a.peak_allocated) + " at event " + std::to_string(std::max<int64_t>(0, a.peak_event)) +
         " (step " + std::to_string(a.peak_step + 1) + " of " + std::to_string(a.steps.size()) + "); reserved then " +
         format_bytes(a.reserved_at_peak) + ", peak reserved " + format_bytes(a.peak_reserved) + "\n";
    for (int k = 0; k < 3; ++k)
      o += "  " + pad_right(to_string(static_cast<MemPart>(k)), 10) + pad_left(format_bytes(a.part_bytes[k]), 11) + "  " +
           pad_left(percent(a.part_bytes[k], a.peak_allocated), 4) + "  " + part_meaning(k) + "\n";
    if (a.leak_bytes_end > 0 && a.shape == "staircase")
      o += "leak: " + format_bytes(a.leak_bytes_end) + " never freed, ~" + format_bytes(a.leak_bytes_per_step) +
           " more every step over " + std::to_string(a.leak_steps) + " steps, allocated at " + a.leak_site + "\n";
  } else {
    o += "at the dump: allocated " + format_bytes(a.dump_allocated) + ", reserved " + format_bytes(a.dump_reserved) + "\n";
  }
  if (a.oom) {
    const SnapshotOom& m = *a.oom;
    o += "OOM: " + std::to_string(m.n_ooms) + " out-of-memory event" + (m.n_ooms == 1 ? "" : "s") + "; the last asked for " +
         format_bytes(m.requested_bytes) + " at event " + std::to_string(m.event) + " (step " + std::to_string(m.step + 1) +
         ") with " + format_bytes(m.allocated_bytes) + " allocated, " + format_bytes(m.reserved_bytes) +
         " reserved, CUDA reporting " + format_bytes(m.device_free_bytes) + " free; at " + m.site + "\n";
  }
  o += a.has_trace ? "top allocation sites at the peak:\n" : "top allocation sites alive at the dump:\n";
  for (const SnapshotSite& s : a.top_sites) {
    o += "  " + pad_left(format_bytes(s.bytes), 11) + pad_left(std::to_string(s.count), 6) + " x  ";
    if (a.has_trace) o += pad_right(to_string(s.dominant), 10);
    o += s.site;
    if (!s.call_chain.empty() && s.call_chain != s.function) o += "  (" + s.call_chain + ")";
    o += "\n";
  }
  if (!a.levers.empty()) {
    o += "what to do, in this order:\n";
    int i = 1;
    for (const SnapshotLever& l : a.levers) {
      o += "  " + std::to_string(i++) + ". [" + l.part + "] " + l.name + (l.changes_policy ? " (changes what the policy learns)" : "") +
           ": " + l.why + "\n";
    }
  }
  if (!a.notes.empty()) {
    o += "notes:\n";
    for (const std::string& n : a.notes) o += "  - " + n + "\n";
  }
  return o;
}

nlohmann::json snapshot_json(const SnapshotAnalysis& a, const std::string& label) {
  using nlohmann::json;
  json j;
  j["file"] = utf8(label);
  j["device"] = a.device;
  j["has_trace"] = a.has_trace;
  j["shape"] = a.shape;
  j["peak_allocated_bytes"] = a.peak_allocated;
  j["peak_event"] = a.peak_event;
  j["peak_step"] = a.peak_step;
  j["reserved_at_peak_bytes"] = a.reserved_at_peak;
  j["peak_reserved_bytes"] = a.peak_reserved;
  j["parts"] = {{"flat_bytes", a.part_bytes[0]}, {"sawtooth_bytes", a.part_bytes[1]}, {"staircase_bytes", a.part_bytes[2]}};
  j["leak"] = {{"bytes_at_end", a.leak_bytes_end},
               {"steps", a.leak_steps},
               {"bytes_per_step", a.leak_bytes_per_step},
               {"site", utf8(a.leak_site)}};
  json sites = json::array();
  for (const SnapshotSite& s : a.top_sites) {
    sites.push_back({{"site", utf8(s.site)},
                     {"filename", utf8(s.filename)},
                     {"line", s.line},
                     {"function", utf8(s.function)},
                     {"call_chain", utf8(s.call_chain)},
                     {"bytes", s.bytes},
                     {"count", s.count},
                     {"part", to_string(s.dominant)},
                     {"flat_bytes", s.part_bytes[0]},
                     {"sawtooth_bytes", s.part_bytes[1]},
                     {"staircase_bytes", s.part_bytes[2]}});
  }
  j["top_sites"] = sites;
  json levers = json::array();
  for (const SnapshotLever& l : a.levers)
    levers.push_back({{"part", l.part}, {"name", utf8(l.name)}, {"why", utf8(l.why)}, {"changes_policy", l.changes_policy}});
  j["levers"] = levers;
  if (a.oom) {
    const SnapshotOom& m = *a.oom;
    j["oom"] = {{"event", m.event},
                {"step", m.step},
                {"count", m.n_ooms},
                {"requested_bytes", m.requested_bytes},
                {"device_free_bytes", m.device_free_bytes},
                {"allocated_bytes", m.allocated_bytes},
                {"reserved_bytes", m.reserved_bytes},
                {"site", utf8(m.site)}};
  } else {
    j["oom"] = nullptr;
  }
  j["timeline"] = {{"events", a.n_events},
                   {"allocs", a.n_allocs},
                   {"frees", a.n_frees},
                   {"first_time_us", a.first_time_us},
                   {"last_time_us", a.last_time_us},
                   {"allocated_start_bytes", a.allocated_start},
                   {"allocated_end_bytes", a.allocated_end},
                   {"reserved_start_bytes", a.reserved_start},
                   {"reserved_end_bytes", a.reserved_end},
                   {"pre_recording_bytes", a.pre_recording_bytes},
                   {"dump_allocated_bytes", a.dump_allocated},
                   {"dump_reserved_bytes", a.dump_reserved},
                   {"step_source", a.step_source},
                   {"n_steps", a.steps.size()}};
  json steps = json::array();
  for (size_t i = 0; i < a.steps.size() && i < 1000; ++i) {
    const SnapshotStep& s = a.steps[i];
    steps.push_back({{"begin_event", s.begin_event},
                     {"end_event", s.end_event},
                     {"start_bytes", s.start_bytes},
                     {"end_bytes", s.end_bytes},
                     {"peak_bytes", s.peak_bytes}});
  }
  j["steps"] = steps;
  json notes = json::array();
  for (const std::string& n : a.notes) notes.push_back(utf8(n));
  j["notes"] = notes;
  return j;
}

std::string snapshot_html(const SnapshotAnalysis& a, const std::string& label) {
  static const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"};
  const double W = 1100, H = 420, L = 90, R = 20, T = 20, B = 40;
  const double pw = W - L - R, ph = H - T - B;
  uint64_t top = std::max<uint64_t>({a.peak_allocated, a.peak_reserved, a.dump_reserved, 1});
  if (a.oom) top = std::max(top, a.oom->reserved_bytes);
  // Round y ticks: 1/2/2.5/5 x 10^k of KiB, MiB or GiB.
  const double unit = top >= (1ull << 30) ? double(1ull << 30) : top >= (1ull << 20) ? double(1ull << 20) : top >= 1024 ? 1024.0 : 1.0;
  const double span = static_cast<double>(top) * 1.04 / unit;
  const double mag = std::pow(10.0, std::floor(std::log10(std::max(span / 5.0, 1e-9))));
  const double r = span / 5.0 / mag;
  const double tick = (r <= 1 ? 1 : r <= 2 ? 2 : r <= 2.5 ? 2.5 : r <= 5 ? 5 : 10) * mag;
  const int n_ticks = std::max(1, static_cast<int>(std::ceil(span / tick - 1e-9)));
  const uint64_t ymax = std::max<uint64_t>(1, static_cast<uint64_t>(n_ticks * tick * unit));
  const double xmax = std::max<double>(1.0, static_cast<double>(a.n_events));
  auto X = [&](int64_t ev) { return L + pw * (static_cast<double>(ev + 1) / xmax); };
  auto Y = [&](double bytes) { return T + ph * (1.0 - bytes / static_cast<double>(ymax)); };
  auto num = [](double v) { return fmt("%.1f", v); };

  std::string svg;
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"timeline\" width=\"" + num(W) + "\" height=\"" + num(H) +
         "\" viewBox=\"0 0 " + num(W) + " " + num(H) + "\" role=\"img\" aria-label=\"allocated and reserved bytes over time\">\n";
  svg += "<rect x=\"" + num(L) + "\" y=\"" + num(T) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
         "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n";
  // y ticks
  for (int t = 0; t <= n_ticks; ++t) {
    double v = t * tick * unit;
    double y = Y(v);
    svg += "<line x1=\"" + num(L) + "\" x2=\"" + num(L + pw) + "\" y1=\"" + num(y) + "\" y2=\"" + num(y) +
           "\" stroke=\"#e5e5e5\"/>\n";
    svg += "<text x=\"" + num(L - 6) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\" font-size=\"11\">" +
           html_escape(format_bytes(static_cast<uint64_t>(v))) + "</text>\n";
  }
  // x ticks (event index)
  for (int t = 0; t <= 5; ++t) {
    double e = xmax * t / 5.0;
    svg += "<text x=\"" + num(L + pw * t / 5.0) + "\" y=\"" + num(T + ph + 16) + "\" text-anchor=\"middle\" font-size=\"11\">" +
           std::to_string(static_cast<int64_t>(e)) + "</text>\n";
  }
  svg += "<text x=\"" + num(L + pw / 2) + "\" y=\"" + num(H - 4) +
         "\" text-anchor=\"middle\" font-size=\"12\">allocator event (trace order)</text>\n";

  if (a.has_trace && !a.timeline.empty()) {
    // Stacked areas: each top site, then "other" up to the allocated total.
    size_t ns = a.timeline_sites.size();
    std::vector<double> lower(a.timeline.size(), 0.0);
    for (size_t s = 0; s <= ns; ++s) {
      std::vector<double> upper(a.timeline.size());
      for (size_t i = 0; i < a.timeline.size(); ++i) {
        const auto& p = a.timeline[i];
        upper[i] = s < ns ? lower[i] + static_cast<double>(p.by_site[s]) : static_cast<double>(p.allocated);
        upper[i] = std::max(upper[i], lower[i]);
      }
      std::string pts;
      for (size_t i = 0; i < a.timeline.size(); ++i) pts += num(X(a.timeline[i].event)) + "," + num(Y(upper[i])) + " ";
      for (size_t i = a.timeline.size(); i-- > 0;) pts += num(X(a.timeline[i].event)) + "," + num(Y(lower[i])) + " ";
      std::string color = s < ns ? kColors[s % 8] : "#bab0ac";
      std::string name = s < ns ? a.timeline_sites[s] : "other";
      svg += "<polygon class=\"site\" points=\"" + pts + "\" fill=\"" + color + "\" fill-opacity=\"0.85\"><title>" +
             html_escape(name) + "</title></polygon>\n";
      lower = upper;
    }
    std::string res, alc;
    for (const auto& p : a.timeline) {
      res += num(X(p.event)) + "," + num(Y(static_cast<double>(p.reserved))) + " ";
      alc += num(X(p.event)) + "," + num(Y(static_cast<double>(p.allocated))) + " ";
    }
    svg += "<polyline id=\"reserved\" points=\"" + res + "\" fill=\"none\" stroke=\"#333\" stroke-dasharray=\"6 3\" stroke-width=\"1.5\"/>\n";
    svg += "<polyline id=\"allocated\" points=\"" + alc + "\" fill=\"none\" stroke=\"#111\" stroke-width=\"1.5\"/>\n";
    for (size_t s = 1; s < a.steps.size(); ++s) {
      double x = X(static_cast<int64_t>(a.steps[s].begin_event) - 1);
      svg += "<line class=\"step\" x1=\"" + num(x) + "\" x2=\"" + num(x) + "\" y1=\"" + num(T) + "\" y2=\"" + num(T + ph) +
             "\" stroke=\"#999\" stroke-dasharray=\"2 3\"/>\n";
    }
    double px = X(a.peak_event), py = Y(static_cast<double>(a.peak_allocated));
    svg += "<circle cx=\"" + num(px) + "\" cy=\"" + num(py) + "\" r=\"4\" fill=\"#d62728\"/>\n";
    svg += "<text x=\"" + num(std::min(px + 6, L + pw - 150)) + "\" y=\"" + num(std::max(py - 6, T + 12)) +
           "\" font-size=\"12\" fill=\"#d62728\">peak " + html_escape(format_bytes(a.peak_allocated)) + "</text>\n";
    if (a.oom) {
      double ox = X(static_cast<int64_t>(a.oom->event));
      svg += "<line id=\"oom\" x1=\"" + num(ox) + "\" x2=\"" + num(ox) + "\" y1=\"" + num(T) + "\" y2=\"" + num(T + ph) +
             "\" stroke=\"#d62728\" stroke-width=\"2\"/>\n";
      svg += "<text x=\"" + num(ox - 4) + "\" y=\"" + num(T + 14) + "\" text-anchor=\"end\" font-size=\"12\" fill=\"#d62728\">OOM: " +
             html_escape(format_bytes(a.oom->requested_bytes)) + " requested</text>\n";
    }
  } else {
    svg += "<text x=\"" + num(L + pw / 2) + "\" y=\"" + num(T + ph / 2) +
           "\" text-anchor=\"middle\" font-size=\"14\">no allocation history recorded: nothing to plot over time</text>\n";
  }
  svg += "</svg>\n";

  std::string legend = "<ul class=\"legend\">\n";
  for (size_t s = 0; s < a.timeline_sites.size(); ++s)
    legend += "<li><span class=\"sw\" style=\"background:" + std::string(kColors[s % 8]) + "\"></span>" +
              html_escape(a.timeline_sites[s]) + "</li>\n";
  if (a.has_trace)
    legend += "<li><span class=\"sw\" style=\"background:#bab0ac\"></span>other</li>\n"
              "<li><span class=\"ln\"></span>allocated</li><li><span class=\"ln dash\"></span>reserved</li>\n";
  legend += "</ul>\n";

  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += "<title>vlac mem snapshot: " + html_escape(label) + "</title>\n";
  h += "<style>\nbody{font-family:sans-serif;margin:24px;color:#222;max-width:1160px}\n"
       "h1{font-size:20px}h2{font-size:16px;margin-top:24px}\n"
       "table{border-collapse:collapse;font-size:13px}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}\n"
       "td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
       ".shape{font-size:16px;font-weight:bold;padding:8px 12px;background:#f3f3f3;border-left:4px solid #d62728}\n"
       ".legend{list-style:none;padding:0;font-size:12px;display:flex;flex-wrap:wrap;gap:6px 18px}\n"
       ".sw{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:middle}\n"
       ".ln{display:inline-block;width:22px;border-top:2px solid #111;margin-right:5px;vertical-align:middle}\n"
       ".ln.dash{border-top:2px dashed #333}\nli.lever{margin:4px 0}code{font-size:12px}\n</style>\n</head>\n<body>\n";
  h += "<h1>Memory snapshot: " + html_escape(label) + "</h1>\n";
  h += "<p class=\"shape\" id=\"shape\">" + html_escape(shape_sentence(a.shape)) + "</p>\n";
  if (a.has_trace) {
    h += "<p>" + html_escape(trace_line(a)) + ". Peak allocated <b>" + html_escape(format_bytes(a.peak_allocated)) +
         "</b> at event " + std::to_string(std::max<int64_t>(0, a.peak_event)) + " (step " + std::to_string(a.peak_step + 1) +
         "); reserved then " + html_escape(format_bytes(a.reserved_at_peak)) + ".</p>\n";
  } else {
    h += "<p>At the dump: allocated " + html_escape(format_bytes(a.dump_allocated)) + ", reserved " +
         html_escape(format_bytes(a.dump_reserved)) + ".</p>\n";
  }
  h += svg + legend;
  if (a.has_trace) {
    h += "<h2>The peak, split</h2>\n<table>\n<tr><th>part</th><th>bytes</th><th>share</th><th>what it is</th></tr>\n";
    for (int k = 0; k < 3; ++k)
      h += "<tr><td>" + std::string(to_string(static_cast<MemPart>(k))) + "</td><td class=\"n\">" + html_escape(format_bytes(a.part_bytes[k])) +
           "</td><td class=\"n\">" + percent(a.part_bytes[k], a.peak_allocated) + "</td><td>" + part_meaning(k) + "</td></tr>\n";
    h += "</table>\n";
    if (a.shape == "staircase")
      h += "<p><b>Leak:</b> " + html_escape(format_bytes(a.leak_bytes_end)) + " never freed, about " +
           html_escape(format_bytes(a.leak_bytes_per_step)) + " more every step over " + std::to_string(a.leak_steps) +
           " steps, allocated at <code>" + html_escape(a.leak_site) + "</code>.</p>\n";
  }
  if (a.oom) {
    const SnapshotOom& m = *a.oom;
    h += "<h2>Out of memory</h2>\n<p>Asked for " + html_escape(format_bytes(m.requested_bytes)) + " at event " +
         std::to_string(m.event) + " with " + html_escape(format_bytes(m.allocated_bytes)) + " allocated and " +
         html_escape(format_bytes(m.reserved_bytes)) + " reserved; CUDA reported " + html_escape(format_bytes(m.device_free_bytes)) +
         " free. Site: <code>" + html_escape(m.site) + "</code>.</p>\n";
  }
  h += std::string("<h2>Top allocation sites ") + (a.has_trace ? "at the peak" : "alive at the dump") +
       "</h2>\n<table>\n<tr><th>bytes</th><th>blocks</th><th>part</th><th>site</th><th>call chain</th></tr>\n";
  for (const SnapshotSite& s : a.top_sites)
    h += "<tr><td class=\"n\">" + html_escape(format_bytes(s.bytes)) + "</td><td class=\"n\">" + std::to_string(s.count) + "</td><td>" +
         (a.has_trace ? to_string(s.dominant) : "") + "</td><td><code>" + html_escape(s.site) + "</code></td><td>" +
         html_escape(s.call_chain) + "</td></tr>\n";
  h += "</table>\n";
  if (!a.levers.empty()) {
    h += "<h2>What to do, in this order</h2>\n<ol>\n";
    for (const SnapshotLever& l : a.levers)
      h += "<li class=\"lever\"><b>[" + html_escape(l.part) + "] " + html_escape(l.name) + "</b>" +
           (l.changes_policy ? " <i>(changes what the policy learns)</i>" : "") + ": " + html_escape(l.why) + "</li>\n";
    h += "</ol>\n";
  }
  if (!a.notes.empty()) {
    h += "<h2>Notes</h2>\n<ul>\n";
    for (const std::string& n : a.notes) h += "<li>" + html_escape(n) + "</li>\n";
    h += "</ul>\n";
  }
  h += "<p style=\"font-size:11px;color:#888\">Generated by vlac mem snapshot. Self-contained: no scripts, no network.</p>\n";
  h += "</body>\n</html>\n";
  return h;
}

}  // namespace vlac
