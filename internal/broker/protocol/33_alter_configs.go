package protocol

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// configChange is one config of an alter request: set to value, or back
// to the broker's default (del).
type configChange struct {
	name, value string
	del         bool
}

// alterTopic applies changes to the topic's config (from the broker's
// defaults instead when replace, as the legacy AlterConfigs replaces
// every dynamic config), or only checks them when validateOnly. A
// refused change alters nothing.
func (s *Server) alterTopic(name string, changes []configChange, replace, validateOnly bool) (int16, error) {
	ti, err := s.b.Topic(name)
	if err != nil {
		return broker.KafkaErrorCode(err), err
	}
	defaults := s.b.DefaultTopicConfig()
	cfg := ti.Config
	if replace {
		cfg = defaults
		cfg.Partitions = ti.Config.Partitions
	}
	seen := map[string]bool{}
	for _, c := range changes {
		if seen[c.name] {
			return kerr.InvalidRequest.Code, fmt.Errorf("config %s named more than once", c.name)
		}
		seen[c.name] = true
		f, ok := findTopicConfigField(c.name)
		if !ok {
			return kerr.InvalidConfig.Code, fmt.Errorf("config %s is not supported", c.name)
		}
		v := c.value
		if c.del {
			v = f.get(defaults)
		}
		if err := f.set(&cfg, v); err != nil {
			return kerr.InvalidConfig.Code, err
		}
	}
	if validateOnly {
		if err := s.b.ValidateTopicConfig(cfg); err != nil {
			return broker.KafkaErrorCode(err), err
		}
		return 0, nil
	}
	after, err := s.b.AlterTopicConfig(name, cfg)
	if err != nil {
		return broker.KafkaErrorCode(err), err
	}
	s.log.Info("altered topic configs", "topic", name, "configs", len(changes), "retention_ms", after.Config.RetentionMs,
		"retention_bytes", after.Config.RetentionBytes, "cleanup_policy", after.Config.CleanupPolicy)
	return 0, nil
}

var errBrokerConfigs = errors.New("the embedded broker's settings are the relay's flags; they cannot be altered through Kafka")

// handleAlterConfigs replaces topics' configs: those not named go back to
// the broker's defaults, as in Kafka.
func (s *Server) handleAlterConfigs(req *kmsg.AlterConfigsRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.AlterConfigsResponse)
	for _, rr := range req.Resources {
		r := kmsg.NewAlterConfigsResponseResource()
		r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
		var code int16
		var err error
		switch rr.ResourceType {
		case kmsg.ConfigResourceTypeTopic:
			changes := make([]configChange, 0, len(rr.Configs))
			for _, c := range rr.Configs {
				ch := configChange{name: c.Name, del: c.Value == nil}
				if c.Value != nil {
					ch.value = *c.Value
				}
				changes = append(changes, ch)
			}
			code, err = s.alterTopic(rr.ResourceName, changes, true, req.ValidateOnly)
		case kmsg.ConfigResourceTypeBroker:
			code, err = kerr.InvalidRequest.Code, errBrokerConfigs
		default:
			code, err = kerr.InvalidRequest.Code, fmt.Errorf("resource type %d cannot be altered", rr.ResourceType)
		}
		r.ErrorCode = code
		if err != nil {
			msg := err.Error()
			r.ErrorMessage = &msg
		}
		resp.Resources = append(resp.Resources, r)
	}
	return resp
}

// handleIncrementalAlterConfigs sets or deletes (back to the default) the
// named configs of topics and keeps the rest. APPEND and SUBTRACT apply
// to list configs only; cleanup.policy is the one list, and it holds one
// policy here, so APPEND of another policy than the current one and
// SUBTRACT of the current one are refused.
func (s *Server) handleIncrementalAlterConfigs(req *kmsg.IncrementalAlterConfigsRequest) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
	for _, rr := range req.Resources {
		r := kmsg.NewIncrementalAlterConfigsResponseResource()
		r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
		var code int16
		var err error
		switch rr.ResourceType {
		case kmsg.ConfigResourceTypeTopic:
			code, err = s.incrementalTopic(rr, req.ValidateOnly)
		case kmsg.ConfigResourceTypeBroker:
			code, err = kerr.InvalidRequest.Code, errBrokerConfigs
		default:
			code, err = kerr.InvalidRequest.Code, fmt.Errorf("resource type %d cannot be altered", rr.ResourceType)
		}
		r.ErrorCode = code
		if err != nil {
			msg := err.Error()
			r.ErrorMessage = &msg
		}
		resp.Resources = append(resp.Resources, r)
	}
	return resp
}

func (s *Server) incrementalTopic(rr kmsg.IncrementalAlterConfigsRequestResource, validateOnly bool) (int16, error) {
	ti, err := s.b.Topic(rr.ResourceName)
	if err != nil {
		return broker.KafkaErrorCode(err), err
	}
	changes := make([]configChange, 0, len(rr.Configs))
	for _, c := range rr.Configs {
		ch := configChange{name: c.Name}
		if c.Value != nil {
			ch.value = *c.Value
		}
		switch c.Op {
		case kmsg.IncrementalAlterConfigOpSet:
		case kmsg.IncrementalAlterConfigOpDelete:
			ch.del = true
		case kmsg.IncrementalAlterConfigOpAppend, kmsg.IncrementalAlterConfigOpSubtract:
			if c.Name != "cleanup.policy" {
				return kerr.InvalidConfig.Code, fmt.Errorf("config %s is not a list: APPEND and SUBTRACT apply to lists", c.Name)
			}
			current := string(ti.Config.CleanupPolicy)
			if (c.Op == kmsg.IncrementalAlterConfigOpAppend) != (ch.value == current) {
				return kerr.InvalidConfig.Code, fmt.Errorf("cleanup.policy is %s and holds one policy here (delete or compact, not both)", current)
			}
			ch.value = current
		default:
			return kerr.InvalidRequest.Code, fmt.Errorf("config %s: unknown operation %d", c.Name, c.Op)
		}
		changes = append(changes, ch)
	}
	return s.alterTopic(rr.ResourceName, changes, false, validateOnly)
}
