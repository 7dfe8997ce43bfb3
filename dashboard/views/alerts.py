"""Alerts: the rules in force, where each (rule, series) stands now, and the history of transitions."""

from __future__ import annotations

import shlex
from datetime import timedelta
from typing import Any

import pandas as pd
import plotly.express as px
import streamlit as st

from alerting import silences
from alerting.api import request_expiry, request_silence
from alerting.rules import AlertRule, AlertRules, load_rules
from dashboard import common, log_search
from dashboard.data.alerts import alerts_data
from eventide.config import Config, ConfigError
from eventide.redaction import scrub_url
from store import pipeline

STATE_COLOURS = {"firing": "#d62728", "pending": "#ff7f0e", "resolved": "#2ca02c", "ok": "#7f7f7f"}


def page() -> None:
    config, minutes = common.start_page("Alerts")
    try:
        loaded = load_rules(config.alert_rules_file)
    except ConfigError as exc:
        st.error(str(exc))
        loaded = AlertRules()
    rules = loaded.rule

    @common.refreshing(config)
    def live() -> None:
        since, until = common.last(minutes)
        data = common.page_data(config, alerts_data, since, until, loaded)
        common.show_freshness(config, data.batches, pipeline.WINDOWS_QUERY)     # the evaluator reads its windows
        states, history, failures = data.states, data.history, data.failures
        firing = states[states["state"] == "firing"] if not states.empty else states
        left, middle, right = st.columns(3)
        left.metric("firing", len(firing))
        middle.metric("pending", int((states["state"] == "pending").sum()) if not states.empty else 0)
        right.metric("rules", len(rules))
        if history.empty:
            st.info("No alert transitions in the chosen range.")
        else:
            fig = px.scatter(common.plot_texts(history, "rule", "series"), x="window_end", y="rule",
                             color="to_state", symbol="severity", color_discrete_map=STATE_COLOURS,
                             hover_data=["series", "value", "threshold"],
                             title="Transitions")
            common.time_axis(common.chart_layout(fig, height=320), (since, until), "window end (UTC)")
            st.plotly_chart(fig, width="stretch")
        st.subheader("Current state")
        if states.empty:
            st.info("No rule has been evaluated yet (the evaluator runs with `./run demo` or `./run alerts`).")
        else:
            links = [_logs_link(rules, row) for row in states.itertuples()]
            # The links column only when an alert has lines to open (firing): a column of nothing else.
            shown = states.assign(logs=links) if any(links) else states
            st.dataframe(common.shown(shown, links=["logs"]), hide_index=True, width="stretch",
                         column_config={"logs": st.column_config.LinkColumn(
                             "logs", display_text="lines", help="A firing error_ratio alert: open its app's "
                             "error and critical lines of the breaching windows on the Logs page; a firing rule on "
                             "log lines: the lines its search counted")})
            for row, link in zip(states.itertuples(), links, strict=True):
                if link:
                    rule = _rule(rules, str(row.rule))
                    what = "Lines" if rule is not None and rule.logs is not None else "Error lines"
                    # Names verbatim (a series holds ingested app, logger and tag names): see common.literal.
                    st.markdown(f":material/search: [{what} of {common.literal(row.rule)} · "
                                f"{common.literal(row.series)}]({link})")
        if not data.groups.empty:
            st.subheader("Groups")
            st.caption("The current alerts as the routes group them, per receiver: one notification carries a "
                       "group's alerts; `to_clear`: resolved, to be sent as resolved in the group's next one; "
                       "`firing_notified`: how many were firing in the last one.")
            st.dataframe(common.shown(data.groups), hide_index=True, width="stretch")
        st.subheader("Silences")
        if data.silences.empty:
            st.info("No silence is active or pending. Mute alerts during a deploy with "
                    "`eventide alerts silence add 'app=\"checkout\"' --duration 2h --comment \"deploy\"`.")
        else:
            st.caption("Alerts a silence matches are still evaluated and shown (column `silenced` above) but not "
                       "sent to receivers. End one with `eventide alerts silence expire ID`.")
            st.dataframe(common.shown(data.silences[["silence_id", "state", "matchers", "starts_at", "ends_at",
                                                     "created_by", "comment"]]), hide_index=True, width="stretch")
        if not data.sent.empty:
            st.subheader("Sent to receivers")
            st.caption("Group notifications of the routes in the rules file, newest first; `alerts` 0: recorded, "
                       "not sent (an all-clear to a receiver without `send_resolved`).")
            st.dataframe(common.shown(data.sent), hide_index=True, width="stretch")
        st.subheader("Failed deliveries")
        if failures.empty:
            st.info("No notification was given up in the chosen range.")
        else:
            st.caption("Notifications a channel gave up (a 4xx answer, attempts or deadline exhausted, or a payload "
                       "that cannot be encoded); they are not tried again.")
            # Reasons stored before the channel stopped quoting its URL may still hold the webhook's secret.
            hook = config.alerting.webhook_url
            st.dataframe(common.shown(failures.assign(reason=[scrub_url(str(r), hook) for r in failures["reason"]])),
                         hide_index=True, width="stretch")

    live()
    _silence_forms(config)
    st.subheader(f"Rules ({config.alert_rules_file})")
    if rules:
        st.dataframe(common.shown(pd.DataFrame([{
            "name": r.name, "series": _series_label(r), "window_s": r.window_s, "statistic": r.statistic,
            "comparator": r.comparator, "threshold": r.threshold, "for": r.for_windows, "severity": r.severity,
            "week_over_week": r.week_over_week} for r in rules])), hide_index=True, width="stretch")


def _silence_forms(config: Config) -> None:
    """Create and expire silences through the alerting service's silences API (the page itself only reads the
    store); without the API, say how to turn it on."""
    with st.expander("Create or expire a silence"):
        if not config.alerting.api_port:
            st.info("The silences API is off: set `alerting.api_port` and `alerting.api_tokens` to create and expire "
                    "silences here, or use `eventide alerts silence add|expire`.")
            return
        with st.form("new_silence", clear_on_submit=True):
            matchers = st.text_input("Matchers", placeholder='app="checkout" severity=~"warning|critical"')
            duration = st.selectbox("For", list(SILENCE_DURATIONS), index=2)
            comment = st.text_input("Comment", placeholder="why: deploy 42")
            if st.form_submit_button("Create silence"):
                try:
                    made = request_silence(config, shlex.split(matchers), SILENCE_DURATIONS[duration],
                                           _author(), comment)
                    st.success(f"Silence {made} created: its alerts are not notified until it ends.")
                except (ConfigError, ValueError) as exc:
                    st.error(str(exc))
        current = silences.listed(config)
        if current:
            with st.form("expire_silence"):
                chosen = st.selectbox("Silence", [s.id for s in current], format_func=lambda i: next(
                    f"{' '.join(map(str, s.matchers))} · {s.comment} ({i[:8]})" for s in current if s.id == i))
                if st.form_submit_button("Expire now"):
                    try:
                        request_expiry(config, str(chosen))
                        st.success("Expired: its alerts are notified again at the next flush.")
                    except ConfigError as exc:
                        st.error(str(exc))


SILENCE_DURATIONS = {"30 minutes": 1800, "1 hour": 3600, "2 hours": 7200, "4 hours": 14400, "1 day": 86400}


def _author() -> str:
    """Who creates a silence from the page: the signed-in user's e-mail when there is one."""
    email = getattr(st.user, "email", None) if getattr(st.user, "is_logged_in", False) else None
    return f"dashboard ({email})" if email else "dashboard"


def _rule(rules: list[AlertRule], name: str) -> AlertRule | None:
    return next((r for r in rules if r.name == name), None)


def _logs_link(rules: list[AlertRule], state: Any) -> str | None:
    """For a firing ``error_ratio`` alert: a link to the Logs page on the series' app and logger, levels error and
    critical; for a firing rule on log lines: its very search on the alert's app. Both from the first breaching
    window (``for`` windows before it fired) to the last window evaluated."""
    rule = _rule(rules, state.rule)
    if state.state != "firing" or rule is None or (rule.statistic != "error_ratio" and rule.logs is None):
        return None
    # The series label is "app · kind · name {tags}" (SeriesKey.label).
    parts = str(state.series).split(" · ")
    if len(parts) < 3:
        return None
    app, name = parts[0], parts[2].split(" {")[0]
    fired = pd.Timestamp(state.since).tz_localize(None).to_pydatetime()
    until = pd.Timestamp(state.evaluated_until).tz_localize(None).to_pydatetime()
    since = fired - timedelta(seconds=rule.window_s * rule.for_windows)
    if rule.logs is not None:
        return rule.logs.link(app, since, max(until, fired))
    return log_search.logs_url(apps=[app], levels=["error", "critical"], names=[name], since=since,
                               until=max(until, fired))


def _series_label(rule: AlertRule) -> str:
    if rule.logs is not None:
        return f"{rule.logs.app} · log · {rule.logs.described}"
    return f"{rule.series.app} · {rule.series.kind} · {rule.series.name}" if rule.series else "pipeline"


page()
