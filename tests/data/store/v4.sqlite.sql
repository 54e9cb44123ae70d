BEGIN TRANSACTION;
CREATE TABLE claims (job_id BIGINT PRIMARY KEY, host TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL);
INSERT INTO "claims" VALUES(42,'gpu-a',1700000121.5);
CREATE TABLE drains (host TEXT NOT NULL, slot TEXT NOT NULL,
            job_id BIGINT NOT NULL, since DOUBLE PRECISION NOT NULL, PRIMARY KEY (host, slot));
INSERT INTO "drains" VALUES('gpu-a','runnerctl/gpu-a/gpu0-3',42,1700000001.5);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, at DOUBLE PRECISION NOT NULL,
            host TEXT NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL, detail TEXT NOT NULL);
INSERT INTO "events" VALUES(1,1700000000.0,'gpu-a','pause','runnerctl/gpu-a/gpu3','by carol: new fan');
INSERT INTO "events" VALUES(2,1700000001.5,'gpu-a','drain','runnerctl/gpu-a/gpu0-3','for pending job 42');
CREATE TABLE gate (host TEXT NOT NULL, gpu INTEGER NOT NULL,
            state TEXT NOT NULL, PRIMARY KEY (host, gpu));
INSERT INTO "gate" VALUES('gpu-a',5,'{"closed": true, "reason": "foreign process 77 (alice)"}');
CREATE TABLE inventory (host TEXT PRIMARY KEY, gpus TEXT NOT NULL, slots TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL);
INSERT INTO "inventory" VALUES('gpu-a','[0, 1, 2, 3, 4, 5, 6, 7]','["runnerctl/gpu-a/gpu0", "runnerctl/gpu-a/gpu0-3"]',1700000003.0);
CREATE TABLE job_history (host TEXT NOT NULL, job_id BIGINT NOT NULL, slot TEXT NOT NULL,
            gpus TEXT NOT NULL, project TEXT NOT NULL, pipeline TEXT NOT NULL, name TEXT NOT NULL,
            username TEXT NOT NULL, url TEXT NOT NULL, queued_at DOUBLE PRECISION,
            started_at DOUBLE PRECISION NOT NULL, seen_at DOUBLE PRECISION NOT NULL,
            ended_at DOUBLE PRECISION, outcome TEXT NOT NULL, util_sum DOUBLE PRECISION NOT NULL,
            util_samples INTEGER NOT NULL, idle_gpu_s DOUBLE PRECISION NOT NULL,
            low_since DOUBLE PRECISION, unused_at DOUBLE PRECISION, PRIMARY KEY (host, job_id));
INSERT INTO "job_history" VALUES('gpu-a',41,'runnerctl/gpu-a/gpu0-3','0,1,2,3','ml/train','9001','train','olga','https://gitlab.example.com/ml/train/-/jobs/41',1699999000.0,1699999100.0,1699999900.5,1699999950.5,'success',12.5,16,120.0,NULL,NULL);
INSERT INTO "job_history" VALUES('gpu-b',43,'runnerctl/gpu-b/gpu5','5','ml/eval','9002','eval','pat','https://gitlab.example.com/ml/eval/-/jobs/43',NULL,1700000050.0,1700000090.25,NULL,'running',0.25,4,37.5,1700000060.0,1700000085.0);
CREATE TABLE protected (host TEXT NOT NULL, job_id BIGINT NOT NULL,
            PRIMARY KEY (host, job_id));
INSERT INTO "protected" VALUES('gpu-a',42);
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,
    name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL);
INSERT INTO "schema_migrations" VALUES(1,'controller tables (the schema before versions)',1.79557404167130780225e+09);
INSERT INTO "schema_migrations" VALUES(2,'host inventory: the GPUs and slots each controller drives (toggle targets are checked against it)',1.7955740416713531017e+09);
INSERT INTO "schema_migrations" VALUES(3,'web sessions on the server, so that they can be ended (runnerctl.web.sessions)',1.79557404167142724985e+09);
INSERT INTO "schema_migrations" VALUES(4,'job history (one row per job a runner of the host ran) and indexes for retention',1.79557404167156100267e+09);
CREATE TABLE toggles (host TEXT NOT NULL, target TEXT NOT NULL,
            action TEXT NOT NULL, who TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, why TEXT NOT NULL,
            PRIMARY KEY (host, target));
INSERT INTO "toggles" VALUES('gpu-a','gpu:3','pause','carol',1700000000.0,'new fan');
INSERT INTO "toggles" VALUES('gpu-b','host','drain','dave',1700000002.0,'');
CREATE TABLE users (name TEXT PRIMARY KEY, password_hash TEXT NOT NULL,
            role TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL);
INSERT INTO "users" VALUES('olga','$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNo','operator',1700000003.0);
CREATE TABLE web_sessions (key TEXT PRIMARY KEY, name TEXT NOT NULL, via TEXT NOT NULL,
            role TEXT NOT NULL, gitlab_id BIGINT, created_at DOUBLE PRECISION NOT NULL,
            checked_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL);
INSERT INTO "web_sessions" VALUES('5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e','olga','local','operator',NULL,1700000004.0,1700000004.0,1800000000.0);
INSERT INTO "web_sessions" VALUES('a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1','pat','gitlab','viewer',17,1700000005.0,1700000005.0,1800000000.0);
CREATE INDEX web_sessions_name ON web_sessions (name, via);
CREATE INDEX job_history_ended ON job_history (ended_at);
CREATE INDEX job_history_started ON job_history (started_at);
CREATE INDEX events_at ON events (at);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('events',2);
COMMIT;
