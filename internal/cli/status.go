package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxrelay/relay/migrations"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/store"
)

func statusCommand() *command {
	return &command{name: "status", summary: "show the relay's state: leader, position, backlog, slot lag, replays", run: status, readOnly: true}
}

// statusReport is what `relay status` prints; its JSON form is for
// scripts.
type statusReport struct {
	Schema string `json:"schema"`
	// LeaderRunning: some relay holds an unexpired lease on the outbox
	// (judged by the database's clock, for display only).
	LeaderRunning bool `json:"leader_running"`
	// LeaderEpoch and LeaderHolder name the current (or last) leader.
	LeaderEpoch  int64  `json:"leader_epoch"`
	LeaderHolder string `json:"leader_holder,omitempty"`
	// Daemon is what the daemon at --http-addr says, when it answers.
	Daemon      *daemonStatus      `json:"daemon,omitempty"`
	Checkpoints []checkpointStatus `json:"checkpoints"`
	Backlog     backlogStatus      `json:"backlog"`
	DeadLetters int64              `json:"dead_letters"`
	// HeldKeys and HeldEvents: keys held behind a dead letter (hold-key
	// policy) and the events waiting behind them.
	HeldKeys    int64                 `json:"held_keys"`
	HeldEvents  int64                 `json:"held_events"`
	LastPublish *time.Time            `json:"last_publish,omitempty"`
	Archive     archiveStatus         `json:"archive"`
	Slots       []slotStatus          `json:"slots"`
	Replays     []relay.ReplayRequest `json:"replays"`
}

type daemonStatus struct {
	Addr  string `json:"addr"`
	Role  string `json:"role"`
	Ready bool   `json:"ready"`
	// Reason is why it is not ready.
	Reason string `json:"reason,omitempty"`
	// Waiting are the topics whose events wait in the outbox because the
	// destination refuses them for now (a missing topic, say).
	Waiting []waitingTopic `json:"waiting,omitempty"`
	// PublishRate and DrainSeconds come from its metrics.
	PublishRate  *float64 `json:"publish_rate_events_per_second,omitempty"`
	DrainSeconds *float64 `json:"backlog_drain_seconds,omitempty"`
	// BrokerHealthy, BrokerLostRecords and BrokerLostRanges come from the
	// embedded broker's metrics, when it exports them.
	BrokerHealthy     *bool    `json:"broker_storage_healthy,omitempty"`
	BrokerLostRecords *float64 `json:"broker_lost_records,omitempty"`
	BrokerLostRanges  *float64 `json:"broker_lost_ranges,omitempty"`
}

type waitingTopic struct {
	Topic  string    `json:"topic"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

type checkpointStatus struct {
	Name      string    `json:"name"`
	Source    string    `json:"source"`
	Position  string    `json:"position"`
	Published int64     `json:"published"`
	UpdatedAt time.Time `json:"updated_at"`
}

type backlogStatus struct {
	Rows int64 `json:"rows"`
	// Estimated: Rows is the planner's estimate (the count stops at
	// store.ExactCountLimit rows).
	Estimated bool `json:"rows_estimated,omitempty"`
	// OldestAgeSeconds is the age of the oldest unpublished row (0 when
	// there is none).
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

type archiveStatus struct {
	Rows int64 `json:"rows"`
	// Estimated: as backlogStatus's.
	Estimated bool `json:"rows_estimated,omitempty"`
	// Oldest is when the first archived event was published.
	Oldest *time.Time `json:"oldest_published_at,omitempty"`
}

type slotStatus struct {
	Name          string `json:"name"`
	Active        bool   `json:"active"`
	LagBytes      *int64 `json:"lag_bytes"`
	RetainedBytes *int64 `json:"retained_wal_bytes"`
}

func status(ctx context.Context, stdio IO, args []string) error {
	var db dbFlags
	fs := db.flagSet("relay status", stdio)
	httpAddr := fs.String("http-addr", "127.0.0.1:9464", "the daemon's HTTP address, asked for its role and drain estimate (empty skips)")
	asJSON := fs.Bool("json", false, "print JSON")
	caFile := fs.String("http-tls-ca-file", "", "PEM CAs of the daemon's HTTPS certificate (when it runs with --http-tls-cert-file)")
	return db.run(ctx, stdio, fs, args, func(conn *pgx.Conn, _ *migrations.Migrator) error {
		rep, err := collectStatus(ctx, conn, db.schema)
		if err != nil {
			return err
		}
		if *httpAddr != "" {
			client, base, err := daemonClient(*httpAddr, *caFile)
			if err != nil {
				return err
			}
			rep.Daemon = askDaemon(ctx, base, client)
			if rep.Daemon != nil {
				rep.Daemon.Addr = *httpAddr
			}
		}
		if *asJSON {
			return writeJSON(stdio.Stdout, rep)
		}
		printStatus(stdio.Stdout, rep)
		return nil
	})
}

// collectStatus reads the report's database part through relay/store;
// its counts are bounded as the daemon's backlog sample is (about N above
// store.ExactCountLimit).
func collectStatus(ctx context.Context, conn *pgx.Conn, schema string) (*statusReport, error) {
	st := store.New(schema)
	rep := &statusReport{Schema: schema, Checkpoints: []checkpointStatus{}, Slots: []slotStatus{}}
	l, err := st.ReadLeadership(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("reading the leadership (is the schema migrated?): %w", err)
	}
	rep.LeaderEpoch, rep.LeaderHolder, rep.LeaderRunning = l.Epoch, l.Holder, l.Running
	cks, err := st.ListCheckpoints(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("reading checkpoints (is the schema migrated?): %w", err)
	}
	for _, ck := range cks {
		c := checkpointStatus{Name: ck.Name, Source: ck.Source, Published: ck.Published, UpdatedAt: ck.UpdatedAt,
			Position: relay.Position{Major: uint64(ck.Major), Minor: uint64(ck.Minor)}.String()}
		rep.Checkpoints = append(rep.Checkpoints, c)
		if rep.LastPublish == nil || c.UpdatedAt.After(*rep.LastPublish) {
			t := c.UpdatedAt
			rep.LastPublish = &t
		}
	}
	sum, err := st.Summarize(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("reading the outbox: %w", err)
	}
	rep.Backlog = backlogStatus{Rows: sum.Backlog, Estimated: sum.Backlog > store.ExactCountLimit, OldestAgeSeconds: sum.OldestAge.Seconds()}
	rep.DeadLetters, rep.HeldKeys, rep.HeldEvents = sum.DeadLetters, sum.HeldKeys, sum.HeldEvents
	rep.Archive = archiveStatus{Rows: sum.Archived, Estimated: sum.Archived > store.ExactCountLimit, Oldest: sum.ArchiveOldest}
	slots, err := st.ListSlots(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("reading replication slots: %w", err)
	}
	for _, s := range slots {
		rep.Slots = append(rep.Slots, slotStatus{Name: s.Name, Active: s.Active, LagBytes: s.LagBytes, RetainedBytes: s.RetainedBytes})
	}
	if rep.Replays, err = relay.ListReplays(ctx, conn, schema, 10); err != nil {
		return nil, fmt.Errorf("reading replay requests: %w", err)
	}
	if rep.Replays == nil {
		rep.Replays = []relay.ReplayRequest{}
	}
	return rep, nil
}

// askDaemon reads the role from /readyz and the drain estimate from
// /metrics; nil when the daemon does not answer.
// daemonClient is the client and base URL for the daemon at addr: HTTPS
// trusting caFile's CAs when one is named.
func daemonClient(addr, caFile string) (*http.Client, string, error) {
	if caFile == "" {
		return http.DefaultClient, "http://" + addr, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, "", fmt.Errorf("--http-tls-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, "", fmt.Errorf("--http-tls-ca-file %s: no PEM certificate in it", caFile)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}, "https://" + addr, nil
}

func askDaemon(ctx context.Context, base string, client *http.Client) *daemonStatus {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	get := func(path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return nil, err
		}
		return client.Do(req)
	}
	resp, err := get("/readyz")
	if err != nil {
		return nil
	}
	var ready struct {
		Role   string `json:"role"`
		Ready  bool   `json:"ready"`
		Reason string `json:"reason"`
	}
	err = json.NewDecoder(resp.Body).Decode(&ready)
	resp.Body.Close()
	if err != nil {
		return nil
	}
	d := &daemonStatus{Role: ready.Role, Ready: ready.Ready, Reason: ready.Reason}
	if resp, err := get("/metrics"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		vals := scrapeGauges(bytes.NewReader(body), "relay_publish_rate_events_per_second", "relay_backlog_drain_seconds",
			"relay_broker_storage_healthy", "relay_broker_lost_records", "relay_broker_lost_ranges")
		d.Waiting = scrapeWaiting(bytes.NewReader(body))
		if v, ok := vals["relay_broker_storage_healthy"]; ok {
			healthy := v == 1
			d.BrokerHealthy = &healthy
		}
		if v, ok := vals["relay_broker_lost_records"]; ok {
			d.BrokerLostRecords = &v
		}
		if v, ok := vals["relay_broker_lost_ranges"]; ok {
			d.BrokerLostRanges = &v
		}
		if v, ok := vals["relay_publish_rate_events_per_second"]; ok {
			d.PublishRate = &v
		}
		if v, ok := vals["relay_backlog_drain_seconds"]; ok {
			d.DrainSeconds = &v
		}
	}
	return d
}

// scrapeWaiting reads the samples of
// relay_destination_waiting_since_timestamp_seconds, sorted by topic.
func scrapeWaiting(r io.Reader) []waitingTopic {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil
	}
	var out []waitingTopic
	for _, m := range families["relay_destination_waiting_since_timestamp_seconds"].GetMetric() {
		w := waitingTopic{Since: time.Unix(0, int64(m.GetGauge().GetValue()*1e9)).UTC()}
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "topic":
				w.Topic = l.GetValue()
			case "reason":
				w.Reason = l.GetValue()
			}
		}
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b waitingTopic) int { return strings.Compare(a.Topic, b.Topic) })
	return out
}

// scrapeGauges reads unlabelled samples of the named metrics from the
// Prometheus text format.
func scrapeGauges(r io.Reader, names ...string) map[string]float64 {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !want[name] {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			out[name] = v
		}
	}
	return out
}

func printStatus(w io.Writer, rep *statusReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	leader := fmt.Sprintf("none (no relay holds an unexpired lease; last epoch %d)", rep.LeaderEpoch)
	if rep.LeaderRunning {
		leader = fmt.Sprintf("running (epoch %d, %s)", rep.LeaderEpoch, rep.LeaderHolder)
	}
	fmt.Fprintf(tw, "schema\t%s\n", rep.Schema)
	fmt.Fprintf(tw, "leader\t%s\n", leader)
	if d := rep.Daemon; d != nil {
		fmt.Fprintf(tw, "daemon at %s\trole %s, ready %v\n", d.Addr, d.Role, d.Ready)
		if !d.Ready && d.Reason != "" {
			fmt.Fprintf(tw, "not ready\t%s\n", d.Reason)
		}
		for _, w := range d.Waiting {
			fmt.Fprintf(tw, "waiting topic %s\t%s since %s (%s): its events wait in the outbox, in order\n",
				w.Topic, w.Reason, w.Since.Format(time.RFC3339), time.Since(w.Since).Round(time.Second))
		}
		if d.BrokerHealthy != nil {
			storage := "storage healthy"
			if !*d.BrokerHealthy {
				storage = "STORAGE FAILED (not acknowledging until reopened from disk)"
			}
			lost := "no data lost"
			if d.BrokerLostRecords != nil && d.BrokerLostRanges != nil && *d.BrokerLostRanges > 0 {
				lost = fmt.Sprintf("DATA LOST: %.0f records in %.0f ranges (relay topics lists them)", *d.BrokerLostRecords, *d.BrokerLostRanges)
			}
			fmt.Fprintf(tw, "embedded broker\t%s, %s\n", storage, lost)
		}
	}
	for _, c := range rep.Checkpoints {
		fmt.Fprintf(tw, "checkpoint %s\tsource %s, position %s, %d published, saved %s\n", c.Name, orDash(c.Source), c.Position, c.Published, c.UpdatedAt.Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "backlog\t%s%d rows", about(rep.Backlog.Estimated), rep.Backlog.Rows)
	if rep.Backlog.Rows > 0 {
		fmt.Fprintf(tw, ", oldest %s old", (time.Duration(rep.Backlog.OldestAgeSeconds * float64(time.Second))).Round(time.Millisecond))
	}
	if d := rep.Daemon; d != nil && d.DrainSeconds != nil && d.PublishRate != nil {
		switch {
		case *d.DrainSeconds < 0:
			fmt.Fprint(tw, ", drain time unknown (nothing published recently)")
		case rep.Backlog.Rows > 0:
			fmt.Fprintf(tw, ", drains in about %s at %.0f events/s", (time.Duration(*d.DrainSeconds) * time.Second).Round(time.Second), *d.PublishRate)
		}
	}
	fmt.Fprintln(tw)
	if rep.LastPublish != nil {
		fmt.Fprintf(tw, "last publish\t%s (%s ago)\n", rep.LastPublish.Format(time.RFC3339), time.Since(*rep.LastPublish).Round(time.Second))
	}
	fmt.Fprintf(tw, "dead letters\t%d\n", rep.DeadLetters)
	if rep.HeldKeys > 0 || rep.HeldEvents > 0 {
		fmt.Fprintf(tw, "held keys\t%d, with %d events waiting behind their dead letters\n", rep.HeldKeys, rep.HeldEvents)
	}
	fmt.Fprintf(tw, "archive\t%s%d events", about(rep.Archive.Estimated), rep.Archive.Rows)
	if rep.Archive.Oldest != nil {
		fmt.Fprintf(tw, ", oldest published %s", rep.Archive.Oldest.Format(time.RFC3339))
	}
	fmt.Fprintln(tw)
	for _, s := range rep.Slots {
		fmt.Fprintf(tw, "slot %s\tactive %v, lag %s bytes, retained WAL %s bytes\n", s.Name, s.Active, intOrDash(s.LagBytes), intOrDash(s.RetainedBytes))
	}
	tw.Flush()
	if len(rep.Replays) == 0 {
		return
	}
	fmt.Fprintln(w, "\nreplays:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tDONE\tTOTAL\tCREATED\tFILTER\tERROR")
	for _, q := range rep.Replays {
		filter, _ := json.Marshal(q.Filter)
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\n", q.ID, q.Status, q.Done, intOrDash(q.Total), q.CreatedAt.Format(time.RFC3339), filter, q.Error)
	}
	tw.Flush()
}

// about prefixes an estimated count.
func about(estimated bool) string {
	if estimated {
		return "about "
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func intOrDash(p *int64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatInt(*p, 10)
}
