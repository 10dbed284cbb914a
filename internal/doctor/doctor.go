package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/internal/sink/kafka"
)

// Status is a check's outcome.
type Status string

const (
	// Pass: the relay has what it needs.
	Pass Status = "PASS"
	// Warn: the relay runs, but something deserves a look.
	Warn Status = "WARN"
	// Fail: the relay cannot work as configured until the fix is applied.
	Fail Status = "FAIL"
	// Skip: the check could not run because an earlier one failed.
	Skip Status = "SKIP"
)

// Result is one check's outcome.
type Result struct {
	Check  string `json:"check"`
	Status Status `json:"status"`
	// Detail says what was found, in one line.
	Detail string `json:"detail"`
	// Fix says what to do, in one line; empty on a pass.
	Fix string `json:"fix,omitempty"`
}

// Config is what `relay run` was told; the checks follow it.
type Config struct {
	// DatabaseURL is the connection string; empty means the PG* variables.
	DatabaseURL string
	Schema      string
	// Source is "poll" or "cdc"; Slot and Publication are the cdc reader's
	// names, empty for the defaults.
	Source      string
	Slot        string
	Publication string
	// Sink is "embedded" or "kafka".
	Sink string
	// DataDir, KafkaAddr: the embedded broker's data directory and Kafka
	// listener address (empty: no listener).
	DataDir   string
	KafkaAddr string
	// HTTPAddr is the metrics and health address (empty: none).
	HTTPAddr string
	// Kafka configures the Kafka sink (Sink "kafka"); Topics are topics
	// declared in the config file, checked there besides those of the
	// events waiting in the outbox.
	Kafka  kafka.Config
	Topics []string
	// Timeout bounds each check's network round trips (default 5s).
	Timeout time.Duration
}

// Check is a named check.
type Check struct {
	Name string
	Run  func(context.Context) Result
}

// Doctor runs the checks of one Config. It holds one PostgreSQL
// connection, opened by the first check that needs it; Close closes it.
type Doctor struct {
	cfg     Config
	conn    *pgx.Conn
	connErr error
	tried   bool
	// kafkaDown is set when KafkaBrokers found no broker answering:
	// KafkaTopics then skips instead of waiting for them again.
	kafkaDown bool
}

// New returns a Doctor for cfg.
func New(cfg Config) *Doctor {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	return &Doctor{cfg: cfg}
}

// Close closes the PostgreSQL connection.
func (d *Doctor) Close(ctx context.Context) {
	if d.conn != nil {
		d.conn.Close(ctx)
		d.conn = nil
	}
}

// Checks are the checks that apply to the Config, in the order they run.
func (d *Doctor) Checks() []Check {
	c := []Check{
		{"postgres", d.Postgres},
		{"schema", d.Schema},
		{"privileges", d.Privileges},
	}
	if d.cfg.Source == "cdc" {
		c = append(c,
			Check{"wal_level", d.WALLevel},
			Check{"replication-role", d.ReplicationRole},
			Check{"replication-slots", d.ReplicationSlots},
			Check{"wal-senders", d.WALSenders},
			Check{"publication", d.Publication},
			Check{"slot", d.Slot},
		)
	}
	if d.cfg.Sink == "kafka" {
		c = append(c, Check{"kafka-brokers", d.KafkaBrokers}, Check{"kafka-topics", d.KafkaTopics})
	} else {
		c = append(c, Check{"data-dir", d.DataDir}, Check{"disk-space", d.DiskSpace}, Check{"data-dir-lock", d.DataDirLock})
		if d.cfg.KafkaAddr != "" {
			c = append(c, Check{"kafka-listener", d.KafkaListener})
		}
	}
	if d.cfg.HTTPAddr != "" {
		c = append(c, Check{"http-listener", d.HTTPListener})
	}
	return c
}

// Run runs every check that applies, in order.
func (d *Doctor) Run(ctx context.Context) []Result {
	var out []Result
	for _, c := range d.Checks() {
		r := c.Run(ctx)
		r.Check = c.Name
		out = append(out, r)
	}
	return out
}

// Failed counts the failures among rs.
func Failed(rs []Result) int {
	n := 0
	for _, r := range rs {
		if r.Status == Fail {
			n++
		}
	}
	return n
}

// Print writes rs for people: one line per check, and the fix on the
// next line when there is one.
func Print(w io.Writer, rs []Result) {
	width := 0
	for _, r := range rs {
		width = max(width, len(r.Check))
	}
	for _, r := range rs {
		fmt.Fprintf(w, "%-4s  %-*s  %s\n", r.Status, width, r.Check, oneLine(r.Detail))
		if r.Fix != "" {
			fmt.Fprintf(w, "      %-*s  fix: %s\n", width, "", oneLine(r.Fix))
		}
	}
	if n := Failed(rs); n > 0 {
		fmt.Fprintf(w, "\n%d of %d checks failed\n", n, len(rs))
	} else {
		fmt.Fprintf(w, "\nall %d checks passed\n", len(rs))
	}
}

// Report is the JSON form of a run.
type Report struct {
	OK      bool     `json:"ok"`
	Version string   `json:"version"`
	Checks  []Result `json:"checks"`
}

// PrintJSON writes rs as one JSON Report.
func PrintJSON(w io.Writer, version string, rs []Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(Report{OK: Failed(rs) == 0, Version: version, Checks: rs})
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func pass(format string, args ...any) Result {
	return Result{Status: Pass, Detail: fmt.Sprintf(format, args...)}
}

func fail(fix, format string, args ...any) Result {
	return Result{Status: Fail, Detail: fmt.Sprintf(format, args...), Fix: fix}
}

func warn(fix, format string, args ...any) Result {
	return Result{Status: Warn, Detail: fmt.Sprintf(format, args...), Fix: fix}
}

var skipNoPostgres = Result{Status: Skip, Detail: "PostgreSQL is not reachable (see the postgres check)"}

// db returns the connection, opening it on first use: read-only
// transactions, a statement timeout, and the connect timeout of Config.
func (d *Doctor) db(ctx context.Context) (*pgx.Conn, error) {
	if d.tried {
		return d.conn, d.connErr
	}
	d.tried = true
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	d.conn, d.connErr = pgconfig.ConnectWith(ctx, d.cfg.DatabaseURL, func(c *pgx.ConnConfig) {
		c.ConnectTimeout = d.cfg.Timeout
		c.RuntimeParams["application_name"] = "relay doctor"
		c.RuntimeParams["default_transaction_read_only"] = "on"
		c.RuntimeParams["statement_timeout"] = fmt.Sprint(d.cfg.Timeout.Milliseconds())
	})
	return d.conn, d.connErr
}

// withDB runs fn with the connection, or skips when there is none.
func (d *Doctor) withDB(ctx context.Context, fn func(ctx context.Context, conn *pgx.Conn) Result) Result {
	conn, err := d.db(ctx)
	if err != nil {
		return skipNoPostgres
	}
	ctx, cancel := context.WithTimeout(ctx, 2*d.cfg.Timeout)
	defer cancel()
	return fn(ctx, conn)
}
