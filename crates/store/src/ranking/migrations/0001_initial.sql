-- Shipped: never edit; add a migration. `{s}` is replaced by the quoted schema name.
CREATE TABLE {s}.metrics_hourly (
    hour    bigint NOT NULL,
    product text COLLATE "C" NOT NULL,
    views   bigint NOT NULL,
    likes   bigint NOT NULL,
    units   bigint NOT NULL,
    sales   bigint NOT NULL,
    PRIMARY KEY (hour, product)
);
CREATE TABLE {s}.processed (
    hour  bigint NOT NULL,
    id    text COLLATE "C" NOT NULL,
    batch bigint NOT NULL,
    PRIMARY KEY (hour, id)
) PARTITION BY RANGE (hour);
CREATE INDEX processed_id ON {s}.processed (id);
CREATE SEQUENCE {s}.event_log_seq;
CREATE TABLE {s}.event_log (
    hour bigint NOT NULL,
    id   text COLLATE "C" NOT NULL,
    seq  bigint NOT NULL DEFAULT nextval('event_log_seq'),
    body bytea NOT NULL,
    PRIMARY KEY (hour, id)
) PARTITION BY RANGE (hour);
CREATE INDEX event_log_order ON {s}.event_log (hour, seq);
CREATE TABLE {s}.product_categories (
    product  text COLLATE "C" NOT NULL,
    category text COLLATE "C" NOT NULL,
    PRIMARY KEY (product, category)
);
CREATE TABLE {s}.policies (
    ranker  text NOT NULL,
    version bigint NOT NULL,
    weights text NOT NULL,
    PRIMARY KEY (ranker, version)
);
CREATE TABLE {s}.ranker_state (
    ranker           text PRIMARY KEY,
    active_version   bigint NOT NULL,
    previous_version bigint,
    latest_version   bigint NOT NULL
);
CREATE TABLE {s}.catalog (
    product text COLLATE "C" PRIMARY KEY,
    body    text NOT NULL
);
CREATE TABLE {s}.meta (
    key   text PRIMARY KEY,
    value bigint NOT NULL
);
CREATE FUNCTION {s}.ensure_day_partitions(days bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = {s} AS $$
DECLARE
    d bigint;
    t text;
BEGIN
    FOREACH d IN ARRAY days LOOP
        FOREACH t IN ARRAY ARRAY['processed', 'event_log'] LOOP
            IF to_regclass(format('%I', t || '_d' || d)) IS NULL THEN
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)',
                               t || '_d' || d, t, d * 24, d * 24 + 24);
            END IF;
        END LOOP;
    END LOOP;
END
$$;
