BEGIN TRANSACTION;
CREATE TABLE claims (job_id BIGINT PRIMARY KEY, host TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL);
CREATE TABLE drains (host TEXT NOT NULL, slot TEXT NOT NULL,
            job_id BIGINT NOT NULL, since DOUBLE PRECISION NOT NULL, PRIMARY KEY (host, slot));
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, at DOUBLE PRECISION NOT NULL,
            host TEXT NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL, detail TEXT NOT NULL);
INSERT INTO "events" VALUES(1,1700000031.0,'demo','pause','runnerctl/demo/gpu4','drained for runnerctl/demo/gpu4-7');
INSERT INTO "events" VALUES(2,1700000031.0,'demo','pause','runnerctl/demo/gpu5','drained for runnerctl/demo/gpu4-7');
INSERT INTO "events" VALUES(3,1700000031.0,'demo','pause','runnerctl/demo/gpu6','drained for runnerctl/demo/gpu4-7');
INSERT INTO "events" VALUES(4,1700000031.0,'demo','pause','runnerctl/demo/gpu7','drained for runnerctl/demo/gpu4-7');
INSERT INTO "events" VALUES(5,1700000031.0,'demo','drain','runnerctl/demo/gpu4-7','for pending job 1006');
INSERT INTO "events" VALUES(6,1700000151.0,'demo','gate-close','gpu6','foreign process 4242 (alice, python train.py)');
INSERT INTO "events" VALUES(7,1700000151.0,'demo','pause','runnerctl/demo/gpu0','drained for runnerctl/demo/gpu0-3');
INSERT INTO "events" VALUES(8,1700000151.0,'demo','pause','runnerctl/demo/gpu1','drained for runnerctl/demo/gpu0-3');
INSERT INTO "events" VALUES(9,1700000151.0,'demo','pause','runnerctl/demo/gpu2','drained for runnerctl/demo/gpu0-3');
INSERT INTO "events" VALUES(10,1700000151.0,'demo','pause','runnerctl/demo/gpu3','drained for runnerctl/demo/gpu0-3');
INSERT INTO "events" VALUES(11,1700000151.0,'demo','resume','runnerctl/demo/gpu4','free');
INSERT INTO "events" VALUES(12,1700000151.0,'demo','resume','runnerctl/demo/gpu5','free');
INSERT INTO "events" VALUES(13,1700000151.0,'demo','resume','runnerctl/demo/gpu7','free');
INSERT INTO "events" VALUES(14,1700000151.0,'demo','drain','runnerctl/demo/gpu0-3','for pending job 1006');
INSERT INTO "events" VALUES(15,1700000271.0,'demo','resume','runnerctl/demo/gpu0-3','open for job 1006');
INSERT INTO "events" VALUES(16,1700000276.0,'demo','pause','runnerctl/demo/gpu0-3','no pending job needs this block');
INSERT INTO "events" VALUES(17,1700000386.0,'demo','gate-open','gpu6','no foreign use for the cool-down');
INSERT INTO "events" VALUES(18,1700000386.0,'demo','pause','runnerctl/demo/gpu4','drained for runnerctl/demo/gpu0-7');
INSERT INTO "events" VALUES(19,1700000386.0,'demo','pause','runnerctl/demo/gpu5','drained for runnerctl/demo/gpu0-7');
INSERT INTO "events" VALUES(20,1700000386.0,'demo','pause','runnerctl/demo/gpu7','drained for runnerctl/demo/gpu0-7');
INSERT INTO "events" VALUES(21,1700000386.0,'demo','drain','runnerctl/demo/gpu0-7','for pending job 1014');
INSERT INTO "events" VALUES(22,1700000456.0,'demo','resume','runnerctl/demo/gpu0-7','open for job 1014');
INSERT INTO "events" VALUES(23,1700000461.0,'demo','pause','runnerctl/demo/gpu0-7','no pending job needs this block');
INSERT INTO "events" VALUES(24,1700000611.0,'demo','resume','runnerctl/demo/gpu0','free');
INSERT INTO "events" VALUES(25,1700000611.0,'demo','resume','runnerctl/demo/gpu1','free');
INSERT INTO "events" VALUES(26,1700000611.0,'demo','resume','runnerctl/demo/gpu2','free');
INSERT INTO "events" VALUES(27,1700000611.0,'demo','resume','runnerctl/demo/gpu3','free');
INSERT INTO "events" VALUES(28,1700000611.0,'demo','resume','runnerctl/demo/gpu4','free');
INSERT INTO "events" VALUES(29,1700000611.0,'demo','resume','runnerctl/demo/gpu5','free');
INSERT INTO "events" VALUES(30,1700000611.0,'demo','resume','runnerctl/demo/gpu6','free');
INSERT INTO "events" VALUES(31,1700000611.0,'demo','resume','runnerctl/demo/gpu7','free');
CREATE TABLE gate (host TEXT NOT NULL, gpu INTEGER NOT NULL,
            state TEXT NOT NULL, PRIMARY KEY (host, gpu));
INSERT INTO "gate" VALUES('demo',0,'{"closed": false, "ecc_baseline": 0, "last_dirty": null, "reason": "", "unhealthy": false, "xid_baseline": 0}');
INSERT INTO "gate" VALUES('demo',1,'{"closed": false, "ecc_baseline": 0, "last_dirty": null, "reason": "", "unhealthy": false, "xid_baseline": 0}');
INSERT INTO "gate" VALUES('demo',2,'{"closed": false, "ecc_baseline": 0, "last_dirty": null, "reason": "", "unhealthy": false, "xid_baseline": 0}');
INSERT INTO "gate" VALUES('demo',3,'{"closed": false, "ecc_baseline": 0, "last_dirty": null, "reason": "", "unhealthy": false, "xid_baseline": 0}');
INSERT INTO "gate" VALUES('demo',4,'{"closed": false, "ecc_baseline": 0, "last_dirty": null, "reason": "", "unhealthy": false, "xid_baseline": 0}');
INSERT INTO "gate" VALUES('demo',5,'{"closed": false, "ecc_baseline": 0, "last_dirty": null, "reason": "", "unhealthy": false, "xid_baseline": 0}');
INSERT INTO "gate" VALUES('demo',6,'{"closed": false, "ecc_baseline": 0, "last_dirty": 1700000326.0, "reason": "", "unhealthy": false, "xid_baseline": 0}');
INSERT INTO "gate" VALUES('demo',7,'{"closed": false, "ecc_baseline": 0, "last_dirty": null, "reason": "", "unhealthy": false, "xid_baseline": 0}');
CREATE TABLE inventory (host TEXT PRIMARY KEY, gpus TEXT NOT NULL, slots TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL);
INSERT INTO "inventory" VALUES('demo','[0, 1, 2, 3, 4, 5, 6, 7]','["gpu0", "gpu0-1", "gpu0-3", "gpu0-7", "gpu1", "gpu2", "gpu2-3", "gpu3", "gpu4", "gpu4-5", "gpu4-7", "gpu5", "gpu6", "gpu6-7", "gpu7"]',1700000001.0);
CREATE TABLE job_history (host TEXT NOT NULL, job_id BIGINT NOT NULL, slot TEXT NOT NULL,
            gpus TEXT NOT NULL, project TEXT NOT NULL, pipeline TEXT NOT NULL, name TEXT NOT NULL,
            username TEXT NOT NULL, url TEXT NOT NULL, queued_at DOUBLE PRECISION,
            started_at DOUBLE PRECISION NOT NULL, seen_at DOUBLE PRECISION NOT NULL,
            ended_at DOUBLE PRECISION, outcome TEXT NOT NULL, util_sum DOUBLE PRECISION NOT NULL,
            util_samples INTEGER NOT NULL, idle_gpu_s DOUBLE PRECISION NOT NULL,
            low_since DOUBLE PRECISION, unused_at DOUBLE PRECISION, PRIMARY KEY (host, job_id));
INSERT INTO "job_history" VALUES('demo',1000,'runnerctl/demo/gpu0','0','p1','','','bob','http://gitlab.sim/p1/-/jobs/1000',NULL,1700000001.0,1700000146.0,1700000148.5,'ended',2.69999999999999857887e+01,30,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1001,'runnerctl/demo/gpu1','1','p1','','','carol','http://gitlab.sim/p1/-/jobs/1001',NULL,1700000001.0,1700000176.0,1700000178.5,'ended',3.23999999999999772621e+01,36,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1002,'runnerctl/demo/gpu2','2','p1','','','dave','http://gitlab.sim/p1/-/jobs/1002',NULL,1700000001.0,1700000206.0,1700000208.5,'ended',3.77999999999999687356e+01,42,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1003,'runnerctl/demo/gpu3','3','p1','','','bob','http://gitlab.sim/p1/-/jobs/1003',NULL,1700000001.0,1700000236.0,1700000238.5,'ended',4.31999999999999602113e+01,48,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1004,'runnerctl/demo/gpu4','4','p1','','','carol','http://gitlab.sim/p1/-/jobs/1004',NULL,1700000001.0,1700000266.0,1700000268.5,'ended',4.85999999999999516848e+01,54,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1005,'runnerctl/demo/gpu5','5','p1','','','dave','http://gitlab.sim/p1/-/jobs/1005',NULL,1700000001.0,1700000296.0,1700000298.5,'ended',5.39999999999999431583e+01,60,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1007,'runnerctl/demo/gpu0','0','p1','','job','carol','http://gitlab.sim/p1/-/jobs/1007',1700000060.0,1700000151.0,1700000266.0,1700000268.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1008,'runnerctl/demo/gpu7','7','p1','','job','dave','http://gitlab.sim/p1/-/jobs/1008',1700000105.0,1700000154.0,1700000271.0,1700000273.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1009,'runnerctl/demo/gpu4','4','p1','','job','bob','http://gitlab.sim/p1/-/jobs/1009',1700000150.0,1700000271.0,1700000386.0,1700000388.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1010,'runnerctl/demo/gpu7','7','p1','','job','carol','http://gitlab.sim/p1/-/jobs/1010',1700000195.0,1700000274.0,1700000391.0,1700000393.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1006,'runnerctl/demo/gpu0-3','0,1,2,3','p1','','job','bob','http://gitlab.sim/p1/-/jobs/1006',1700000030.0,1700000274.0,1700000451.0,1700000453.5,'ended',3.23999999999999772621e+01,36,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1011,'runnerctl/demo/gpu5','5','p1','','job','dave','http://gitlab.sim/p1/-/jobs/1011',1700000240.0,1700000301.0,1700000416.0,1700000418.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1014,'runnerctl/demo/gpu0-7','0,1,2,3,4,5,6,7','p1','','job','dave','http://gitlab.sim/p1/-/jobs/1014',1700000360.0,1700000457.0,1700000606.0,1700000608.5,'ended',2.69999999999999857887e+01,30,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1012,'runnerctl/demo/gpu0','0','p1','','job','bob','http://gitlab.sim/p1/-/jobs/1012',1700000285.0,1700000613.0,1700000731.0,1700000733.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1013,'runnerctl/demo/gpu1','1','p1','','job','carol','http://gitlab.sim/p1/-/jobs/1013',1700000330.0,1700000613.0,1700000731.0,1700000733.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1015,'runnerctl/demo/gpu2','2','p1','','job','bob','http://gitlab.sim/p1/-/jobs/1015',1700000375.0,1700000613.0,1700000731.0,1700000733.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1016,'runnerctl/demo/gpu3','3','p1','','job','carol','http://gitlab.sim/p1/-/jobs/1016',1700000420.0,1700000613.0,1700000731.0,1700000733.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1017,'runnerctl/demo/gpu4','4','p1','','job','dave','http://gitlab.sim/p1/-/jobs/1017',1700000465.0,1700000613.0,1700000731.0,1700000733.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1018,'runnerctl/demo/gpu5','5','p1','','job','bob','http://gitlab.sim/p1/-/jobs/1018',1700000510.0,1700000613.0,1700000731.0,1700000733.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1019,'runnerctl/demo/gpu6','6','p1','','job','carol','http://gitlab.sim/p1/-/jobs/1019',1700000555.0,1700000613.0,1700000731.0,1700000733.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1020,'runnerctl/demo/gpu7','7','p1','','job','dave','http://gitlab.sim/p1/-/jobs/1020',1700000600.0,1700000613.0,1700000731.0,1700000733.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1021,'runnerctl/demo/gpu0','0','p1','','job','bob','http://gitlab.sim/p1/-/jobs/1021',1700000645.0,1700000733.0,1700000851.0,1700000853.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1022,'runnerctl/demo/gpu1','1','p1','','job','carol','http://gitlab.sim/p1/-/jobs/1022',1700000690.0,1700000733.0,1700000851.0,1700000853.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
INSERT INTO "job_history" VALUES('demo',1023,'runnerctl/demo/gpu2','2','p1','','','dave','http://gitlab.sim/p1/-/jobs/1023',NULL,1700000736.0,1700000851.0,1700000853.5,'ended',2.15999999999999943152e+01,24,0.0,NULL,NULL);
CREATE TABLE protected (host TEXT NOT NULL, job_id BIGINT NOT NULL,
            PRIMARY KEY (host, job_id));
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,
    name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL);
INSERT INTO "schema_migrations" VALUES(1,'controller tables (the schema before versions)',1.7959339525236124993e+09);
INSERT INTO "schema_migrations" VALUES(2,'host inventory: the GPUs and slots each controller drives (toggle targets are checked against it)',1.79593395252365064618e+09);
INSERT INTO "schema_migrations" VALUES(3,'job history (one row per job a runner of the host ran) and indexes for retention',1.79593395252376270294e+09);
CREATE TABLE toggles (host TEXT NOT NULL, target TEXT NOT NULL,
            action TEXT NOT NULL, who TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, why TEXT NOT NULL,
            PRIMARY KEY (host, target));
CREATE TABLE users (name TEXT PRIMARY KEY, password_hash TEXT NOT NULL,
            role TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL);
CREATE INDEX job_history_ended ON job_history (ended_at);
CREATE INDEX job_history_started ON job_history (started_at);
CREATE INDEX events_at ON events (at);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('events',31);
COMMIT;
