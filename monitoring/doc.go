// Package monitoring owns what Relay ships for its operators' monitoring,
// and the tests that keep it true to the binary:
//   - alerts.yml, Prometheus alerting rules (load it with rule_files);
//   - alerts_test.yml, their unit tests for `promtool test rules`: each
//     alert fires on the series of its fault and stays silent beside it;
//   - dashboard.json, a Grafana dashboard (import it; it asks for a
//     Prometheus data source).
//
// The tests run promtool (Debian's prometheus package; .ci/run installs
// it) on the rules, their unit tests and every dashboard query, and check
// that each metric the rules and the dashboard name is one a real `relay
// run` exports, with every conditional family made to appear: a dead
// letter, a pipeline restart, a topic the destination refuses, a consumer
// group's commits, a share group's fetch and the WAL reader's slot.
package monitoring
