CREATE INDEX ix_adoptions_source_descriptor ON adoptions (source_descriptor);
CREATE INDEX ix_claims_deadline ON claims (deadline);
CREATE INDEX ix_claims_position ON claims (position);
CREATE INDEX ix_completions_adopted_from ON completions (adopted_from) WHERE adopted_from IS NOT NULL;
CREATE INDEX ix_completions_benchmark_instruction_id ON completions (benchmark, instruction_id);
CREATE INDEX ix_completions_created_at ON completions (created_at);
CREATE INDEX ix_completions_model ON completions (model);
CREATE INDEX ix_completions_run_id ON completions (run_id);
CREATE INDEX ix_judgements_adopted_from ON judgements (adopted_from) WHERE adopted_from IS NOT NULL;
CREATE INDEX ix_judgements_benchmark_instruction_id ON judgements (benchmark, instruction_id);
CREATE INDEX ix_judgements_created_at ON judgements (created_at);
CREATE INDEX ix_judgements_judge ON judgements (judge);
CREATE INDEX ix_judgements_model_a ON judgements (model_a);
CREATE INDEX ix_judgements_model_b ON judgements (model_b);
CREATE INDEX ix_judgements_run_id ON judgements (run_id);
CREATE INDEX ix_runs_run_id ON runs (run_id);
CREATE INDEX ix_runs_started_at ON runs (started_at);
CREATE TABLE adoptions (
  id INTEGER NOT NULL,
  source_descriptor VARCHAR(64) NOT NULL,
  source_task VARCHAR NOT NULL,
  source_rows INTEGER NOT NULL,
  details JSON NOT NULL,
  sampled INTEGER NOT NULL,
  exact INTEGER NOT NULL,
  max_abs_logprob_delta FLOAT,
  top_tokens_changed INTEGER NOT NULL,
  sample_seed INTEGER,
  min_exact FLOAT NOT NULL,
  max_logprob_delta FLOAT,
  rows_adopted INTEGER NOT NULL,
  rows_present INTEGER NOT NULL,
  rows_excluded INTEGER NOT NULL,
  run_id VARCHAR,
  created_by VARCHAR,
  adopted_at DATETIME NOT NULL,
  CONSTRAINT pk_adoptions PRIMARY KEY (id)
);
CREATE TABLE claims (
  input_hash VARCHAR(64) NOT NULL,
  position INTEGER NOT NULL,
  holder VARCHAR,
  deadline DATETIME,
  attempts INTEGER NOT NULL,
  failed TEXT,
  updated_at DATETIME NOT NULL,
  CONSTRAINT pk_claims PRIMARY KEY (input_hash)
);
CREATE TABLE completions (
  input_hash VARCHAR(64) NOT NULL,
  sample_index INTEGER NOT NULL,
  benchmark VARCHAR,
  instruction_id VARCHAR,
  model VARCHAR,
  finish_reason VARCHAR,
  run_id VARCHAR,
  created_by VARCHAR,
  created_at DATETIME NOT NULL,
  usage JSON,
  top_logprobs JSON,
  input_text TEXT NOT NULL,
  completion TEXT NOT NULL,
  adopted_from VARCHAR(64),
  CONSTRAINT ck_completions_sample_index_nonnegative CHECK (sample_index >= 0),
  CONSTRAINT pk_completions PRIMARY KEY (input_hash)
);
CREATE TABLE judgements (
  input_hash VARCHAR(64) NOT NULL,
  sample_index INTEGER NOT NULL,
  benchmark VARCHAR,
  instruction_id VARCHAR,
  model_a VARCHAR,
  model_b VARCHAR,
  judge VARCHAR,
  orientation VARCHAR(16),
  finish_reason VARCHAR,
  run_id VARCHAR,
  created_by VARCHAR,
  created_at DATETIME NOT NULL,
  usage JSON,
  top_logprobs JSON,
  input_text TEXT NOT NULL,
  completion TEXT NOT NULL,
  adopted_from VARCHAR(64),
  CONSTRAINT ck_judgements_orientation_valid CHECK (orientation IS NULL OR orientation IN ('direct', 'reversed')),
  CONSTRAINT ck_judgements_sample_index_nonnegative CHECK (sample_index >= 0),
  CONSTRAINT pk_judgements PRIMARY KEY (input_hash)
);
CREATE TABLE judgestore_alembic_version (
  version_num VARCHAR(32) NOT NULL,
  CONSTRAINT judgestore_alembic_version_pkc PRIMARY KEY (version_num)
);
CREATE TABLE runs (
  id INTEGER NOT NULL,
  role VARCHAR(16) NOT NULL,
  run_id VARCHAR,
  created_by VARCHAR,
  started_at DATETIME NOT NULL,
  finished_at DATETIME NOT NULL,
  mode VARCHAR(16) NOT NULL,
  requested INTEGER NOT NULL,
  distinct_inputs INTEGER NOT NULL,
  hits INTEGER NOT NULL,
  misses INTEGER NOT NULL,
  duplicates INTEGER NOT NULL,
  generated INTEGER NOT NULL,
  rows_written INTEGER NOT NULL,
  truncated INTEGER NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  completion_tokens INTEGER NOT NULL,
  engine_seconds FLOAT NOT NULL,
  saved_prompt_tokens INTEGER NOT NULL,
  saved_completion_tokens INTEGER NOT NULL,
  saved_engine_seconds FLOAT NOT NULL,
  hits_without_cost INTEGER NOT NULL,
  wall_seconds FLOAT NOT NULL,
  CONSTRAINT ck_runs_role_valid CHECK (role IN ('completions', 'judgements')),
  CONSTRAINT pk_runs PRIMARY KEY (id)
);
