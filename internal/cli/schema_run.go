package cli

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/internal/registry"
	"github.com/outboxrelay/relay/relay"
)

// schemaRunFlags are relay run's flags for schema contracts.
type schemaRunFlags struct {
	registry   bool
	topics     string
	wireFormat bool
}

func (s *schemaRunFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&s.registry, "schema-registry", false, "serve the embedded schema registry (the Confluent Schema Registry REST API subset) on --http-addr")
	fs.StringVar(&s.topics, "schema-topics", "", "topics with a schema contract, comma-separated: each event's payload must match the latest version of subject <topic>-value (or the version its schema-version header names), else it goes to the dead letters; * for every topic whose subject is registered")
	fs.BoolVar(&s.wireFormat, "schema-wire-format", false, "with --schema-topics: publish the values of contract topics in the Confluent wire format (zero byte, schema id, payload) for the standard deserializers")
}

func (s *schemaRunFlags) validate(httpAddr string) error {
	if s.registry && httpAddr == "" {
		return usagef("--schema-registry needs --http-addr")
	}
	if s.wireFormat && s.topicList() == nil {
		return usagef("--schema-wire-format needs --schema-topics")
	}
	for _, t := range s.topicList() {
		if t != "*" {
			if err := relay.ValidTopic(t); err != nil {
				return usagef("--schema-topics: %v", err)
			}
		}
	}
	return nil
}

func (s *schemaRunFlags) topicList() []string {
	var out []string
	for _, t := range strings.Split(s.topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// schemaContracts is what relay run serves and checks: the registry's
// store with its own small pool, and the validator when topics have
// contracts.
type schemaContracts struct {
	pool      *pgxpool.Pool
	store     *registry.Store
	validator *registry.Validator
}

// open connects the registry when a schema flag asks for it (nil, nil
// otherwise).
func (s *schemaRunFlags) open(ctx context.Context, db dbFlags) (*schemaContracts, error) {
	if !s.registry && s.topicList() == nil {
		return nil, nil
	}
	connCfg, err := pgconfig.ParseConfig(db.url)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig = connCfg
	cfg.ConnConfig.RuntimeParams["application_name"] = relay.ApplicationName + " schema registry"
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL at %s: %w", pgconfig.Describe(&connCfg.Config), err)
	}
	store, err := registry.NewStore(pool, db.schema)
	if err != nil {
		pool.Close()
		return nil, err
	}
	c := &schemaContracts{pool: pool, store: store}
	if topics := s.topicList(); topics != nil {
		c.validator = registry.NewValidator(registry.ValidatorConfig{Store: store, Topics: topics, Frame: s.wireFormat})
	}
	return c, nil
}

// relayValidator is the validator for relay.Config: a nil interface when
// no topic has a contract.
func (c *schemaContracts) relayValidator() relay.Validator {
	if c == nil || c.validator == nil {
		return nil
	}
	return c.validator
}

// handler adds the registry's API to the relay's handler when served.
func (c *schemaContracts) handler(s *schemaRunFlags, base http.Handler, log *slog.Logger) http.Handler {
	if c == nil || !s.registry {
		return base
	}
	mux := http.NewServeMux()
	registry.Routes(mux, c.store, log)
	mux.Handle("/", base)
	return mux
}

func (c *schemaContracts) close() {
	if c != nil {
		c.pool.Close()
	}
}
