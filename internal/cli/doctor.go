package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/outboxrelay/relay/internal/buildinfo"
	"github.com/outboxrelay/relay/internal/doctor"
)

func doctorCommand() *command {
	return &command{name: "doctor", summary: "check everything relay run needs (takes run's flags and config), PASS/WARN/FAIL with fixes", run: runDoctor, readOnly: true}
}

// errChecksFailed ends relay doctor with status 1 once the report is out.
var errChecksFailed = errors.New("checks failed")

func runDoctor(ctx context.Context, stdio IO, args []string) error {
	var asJSON bool
	f, err := parseRunAs("relay doctor", stdio, args, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the results as JSON")
	})
	if err != nil {
		return err
	}
	cfg, err := f.doctorConfig(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	d := doctor.New(cfg)
	defer d.Close(context.WithoutCancel(ctx))
	rs := d.Run(ctx)
	if asJSON {
		if err := doctor.PrintJSON(stdio.Stdout, buildinfo.Version, rs); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdio.Stdout, "relay %s: checking --source %s --sink %s\n\n", buildinfo.Version, f.source, f.sink)
		doctor.Print(stdio.Stdout, rs)
	}
	if n := doctor.Failed(rs); n > 0 {
		return fmt.Errorf("%w: %d of %d", errChecksFailed, n, len(rs))
	}
	return nil
}

// doctorConfig is what the checks need of run's flags.
func (f *runFlags) doctorConfig(log *slog.Logger) (doctor.Config, error) {
	cfg := doctor.Config{
		DatabaseURL: f.db.url, Schema: f.db.schema,
		Source: f.source, Slot: f.slot, Publication: f.publication,
		Sink: f.sink, DataDir: f.dataDir, KafkaAddr: f.kafkaAddr, HTTPAddr: f.httpAddr,
	}
	if f.sink == "kafka" {
		kc, err := f.kafka.config(log)
		if err != nil {
			return cfg, err
		}
		cfg.Kafka = kc
	}
	if f.file != nil {
		for _, t := range f.file.Topics {
			cfg.Topics = append(cfg.Topics, t.Name)
		}
	}
	return cfg, nil
}

// preflightTimeout bounds each round trip of relay run's checks at start,
// so that an outage delays the start by little before run's own retries
// take over.
const preflightTimeout = 3 * time.Second

// preflight runs relay doctor's checks at the start of relay run and
// logs each failure and warning once, in doctor's words. None stops the
// run (see internal/doctor's package doc for why).
func (f *runFlags) preflight(ctx context.Context, log *slog.Logger) {
	cfg, err := f.doctorConfig(log)
	if err != nil {
		return // run refuses the same configuration itself
	}
	cfg.Timeout = preflightTimeout
	d := doctor.New(cfg)
	defer d.Close(context.WithoutCancel(ctx))
	for _, r := range d.Run(ctx) {
		switch r.Status {
		case doctor.Fail:
			log.Error("check failed: "+r.Detail, "check", r.Check, "fix", r.Fix)
		case doctor.Warn:
			log.Warn("check: "+r.Detail, "check", r.Check, "fix", r.Fix)
		}
	}
}
